"""Ops of TCNCA (Terzić et al. 2023) and MEGA: dilated convolution, damped EMA, chunked attention, rotary positions."""

import pytest
import torch
from conftest import LENGTHS, random_chunks, relative_error

from tokenmix.ops.attention import attention_block, chunk_mask, chunked_attention, merge_blocks, naive_attention, rotary
from tokenmix.ops.dilated import causal_dilated_chunk, dilated_conv, naive_dilated_conv
from tokenmix.ops.ema import ema_chunk, ema_kernel, naive_ema
from tokenmix.ops.toeplitz import toeplitz_matvec
from tokenmix.parallel.shards import shard_bounds


def _gradients_agree(fast, slow, inputs, tolerance):
    """Every input's gradient agrees, relative to the largest reference gradient (a gradient that is
    exactly zero, as the queries' where each sees one key, then checks its round-off at that scale)."""
    grad = torch.randn_like(fast)
    fast_grads, slow_grads = torch.autograd.grad(fast, inputs, grad), torch.autograd.grad(slow, inputs, grad)
    scale = max(float(b.norm()) for b in slow_grads)
    for a, b in zip(fast_grads, slow_grads, strict=True):
        assert float((a - b).norm()) <= tolerance * scale


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dilation", [1, 3, 64])
@pytest.mark.parametrize("min_lag", [0, -2])
def test_dilated_conv_matches_the_tap_loop(n, dilation, min_lag):
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    fast, slow = dilated_conv(x, taps, dilation, min_lag), naive_dilated_conv(x, taps, dilation, min_lag)
    assert relative_error(fast, slow) < 1e-12
    _gradients_agree(fast, slow, [x, taps], 1e-12)


def test_dilated_conv_rejects_bad_arguments():
    x = torch.randn(1, 10, 3)
    with pytest.raises(ValueError, match="dilation"):
        dilated_conv(x, torch.randn(3, 5), 0, 0)
    with pytest.raises(ValueError, match="taps"):
        dilated_conv(x, torch.randn(4, 5), 2, 0)
    with pytest.raises(ValueError, match="min_lag"):
        dilated_conv(x, torch.randn(3, 5), 2, 1)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dilation", [1, 4, 64])
def test_causal_dilated_chunks_from_a_history_equal_the_whole_convolution(n, dilation):
    taps, x = torch.randn(3, 5, dtype=torch.float64), torch.randn(2, n, 3, dtype=torch.float64)
    history, outputs = x.new_zeros(2, 4 * dilation, 3), []
    for chunk in random_chunks(n, seed=n):
        y, history = causal_dilated_chunk(x[:, chunk], history, taps, dilation)
        outputs.append(y)
    assert relative_error(torch.cat(outputs, dim=1), naive_dilated_conv(x, taps, dilation, 0)) < 1e-12
    with pytest.raises(ValueError, match="history must hold the last"):
        causal_dilated_chunk(x[:, :1], history[:, 1:], taps, dilation)
    assert history.untyped_storage().nbytes() == history.numel() * history.element_size()  # not a view of the window
    with pytest.raises(ValueError, match="dilation must be an integer >= 1"):
        causal_dilated_chunk(x[:, :1], history, taps, 0)


@pytest.mark.parametrize("n", LENGTHS)
def test_ema_fft_convolution_equals_the_recurrence(n):
    """k_d[l] = sum_j c b q^l applied by FFT == h_t = b x_t + q h_{t-1}, y_t = sum_j c h_t."""
    d, ndim = 4, 3
    input_weight = torch.randn(d, ndim, dtype=torch.float64, requires_grad=True)
    decay = torch.rand(d, ndim, dtype=torch.float64).mul(0.3).add(0.69).requires_grad_()
    readout = torch.randn(d, ndim, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, n, d, dtype=torch.float64, requires_grad=True)
    fast = toeplitz_matvec(x, ema_kernel(input_weight, decay, readout, n), causal=True)
    slow = naive_ema(x, input_weight, decay, readout)
    assert relative_error(fast, slow) < 1e-12
    _gradients_agree(fast, slow, [x, input_weight, decay, readout], 1e-10)


@pytest.mark.parametrize("n", LENGTHS)
def test_ema_chunks_from_a_state_equal_the_recurrence(n):
    """Any chunking (1-token chunks included) carries the state exactly: outputs and final state."""
    d, ndim = 4, 3
    input_weight, readout = torch.randn(d, ndim, dtype=torch.float64), torch.randn(d, ndim, dtype=torch.float64)
    decay = torch.rand(d, ndim, dtype=torch.float64).mul(0.3).add(0.69)
    x = torch.randn(2, n, d, dtype=torch.float64)
    state, outputs = x.new_zeros(2, d, ndim), []
    for chunk in random_chunks(n, seed=n):
        y, state = ema_chunk(x[:, chunk], state, input_weight, decay, readout)
        outputs.append(y)
    expected_state = x.new_zeros(2, d, ndim)
    for t in range(n):
        expected_state = input_weight * x[:, t, :, None] + decay * expected_state
    assert relative_error(torch.cat(outputs, dim=1), naive_ema(x, input_weight, decay, readout)) < 1e-12
    assert relative_error(state, expected_state) < 1e-12


def test_an_ema_chunk_takes_a_state_in_another_dtype():
    coefficients = [torch.rand(4, 3) * 0.5 + 0.25 for _ in range(3)]
    y, state = ema_chunk(torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 4, 3, dtype=torch.float64), *coefficients)
    assert y.dtype == torch.float64 and state.dtype == torch.float32  # the state follows the coefficients


def test_ema_kernel_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="input_weight, decay and readout"):
        ema_kernel(torch.ones(2, 3), torch.ones(2, 4), torch.ones(2, 3), 5)


def _mask_for(n, chunk_size, causal, key_mask):
    allowed = chunk_mask(n, chunk_size, causal)
    if key_mask is None:
        return allowed
    return (allowed & key_mask[:, None, None, :]) | torch.eye(n, dtype=torch.bool)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("chunk_size", [None, 1, 32])
@pytest.mark.parametrize("causal", [False, True])
def test_chunked_attention_is_full_attention_under_a_block_mask(n, chunk_size, causal):
    q, k = (torch.randn(2, 2, n, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 2, n, 5, dtype=torch.float64, requires_grad=True)
    fast = chunked_attention(q, k, v, chunk_size, causal)
    slow = naive_attention(q, k, v, chunk_mask(n, chunk_size, causal))
    assert relative_error(fast, slow) < 1e-12
    _gradients_agree(fast, slow, [q, k, v], 1e-10)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("chunk", "max_scores"), [(16, 1 << 24), (None, 6 * 100 * 7)])
def test_chunked_attention_with_key_mask_and_relative_bias(causal, with_bias, chunk, max_scores):
    """max_scores = batch * heads * n * 7: full attention with a bias in query tiles of 7 rows (the last
    one of 2), each recomputed in backward."""
    n = 100
    q, k = (torch.randn(2, 3, n, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 3, n, 12, dtype=torch.float64, requires_grad=True)  # wider than the keys, as MEGA's
    key_mask = torch.rand(2, n) < 0.7
    table = torch.randn(2 * n - 1, dtype=torch.float64, requires_grad=True)

    def bias(queries, keys):
        return table[queries[:, None] - keys[None, :] + n - 1]

    fast = chunked_attention(q, k, v, chunk, causal, key_mask, bias if with_bias else None, max_scores=max_scores)
    positions = torch.arange(n)
    slow = naive_attention(q, k, v, _mask_for(n, chunk, causal, key_mask), bias(positions, positions) if with_bias else None)
    real = key_mask[:, None, :, None]
    assert relative_error(fast * real, slow * real) < 1e-12
    assert torch.isfinite(fast).all()
    _gradients_agree(fast * real, slow * real, [q, k, v, table] if with_bias else [q, k, v], 1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_a_learned_bias_keeps_no_score_matrix(causal):
    """A learned bias (MEGA's) is computed and kept a tile of queries at a time: what autograd keeps
    grows like n. Fails if the (n, n) bias, mask or probabilities are kept: 4096^2 floats, 64 MB each."""
    from tokenmix.train.memory import saved_tensor_bytes

    n = 4096
    q, k, v = (torch.randn(1, 1, n, 8, requires_grad=True) for _ in range(3))
    table = torch.randn(2 * n - 1, requires_grad=True)

    def bias(queries, keys):
        return table[queries[:, None] - keys[None, :] + n - 1]

    kept = saved_tensor_bytes(lambda: chunked_attention(q, k, v, None, causal, None, bias, max_scores=n * 256).sum(), set())
    assert kept < 40 * q.numel() * q.element_size()


@pytest.mark.parametrize("chunk_size", [None, 64])
@pytest.mark.parametrize("value_width", [8, 16, 4])
def test_bidirectional_attention_with_a_key_mask_keeps_no_score_matrix(chunk_size, value_width):
    """A padded batch (a key mask) still runs on a fused kernel: what autograd keeps grows like n, not n * c.
    Fails if blocks stay a fifth dimension, the mask gets a row per query or values are not as wide as
    keys (MEGA's are twice as wide): PyTorch then materialises the (n, c) probabilities, 2 x 2 x 4096 x
    4096 floats, 128 MB, at full attention here."""
    from tokenmix.train.memory import saved_tensor_bytes

    n = 4096
    q, k = (torch.randn(2, 2, n, 8, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 2, n, value_width, requires_grad=True)
    key_mask = torch.arange(n)[None, :] < torch.tensor([[n], [n - 100]])
    kept = saved_tensor_bytes(lambda: chunked_attention(q, k, v, chunk_size, False, key_mask).sum(), set())
    assert kept < 40 * q.numel() * q.element_size()  # q, k, v, the output and the key mask, a few times over


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_added_up_block_by_block_is_full_attention(n, causal, with_bias):
    """Ring attention's arithmetic (``attention_block``, ``merge_blocks``): full attention over 4 key blocks
    of any size (empty ones where n < 4), each attended alone and added up in the order the ring brings
    them, equals full attention, forward and gradients, with padding (a sequence of padding alone too)
    and a learned bias. Queries are a middle block of positions, as a shard's."""
    torch.manual_seed(n)
    q, k = (torch.randn(3, 2, n, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(3, 2, n, 5, dtype=torch.float64, requires_grad=True)
    key_mask = torch.rand(3, n) < 0.7
    key_mask[2] = False
    table = torch.randn(2 * n - 1, dtype=torch.float64, requires_grad=True)

    def bias(queries, keys):
        return table[queries[:, None] - keys[None, :] + n - 1]

    bias_function = bias if with_bias else None
    positions = torch.arange(n)
    whole = chunked_attention(q, k, v, None, causal, key_mask, bias_function)
    blocks = shard_bounds(n, 4)
    mine = 1 if n > 1 else 0
    first, last = blocks[mine]
    visible = key_mask if causal else key_mask | ~key_mask.any(dim=-1, keepdim=True)
    merged = None
    for index in [(mine - turn) % 4 for turn in range(4)]:
        start, stop = blocks[index]
        if stop == start or (causal and start >= last):
            continue
        block = attention_block(
            q[:, :, first:last],
            k[:, :, start:stop],
            v[:, :, start:stop],
            positions[first:last],
            positions[start:stop],
            visible[:, start:stop],
            causal,
            bias_function,
        )
        merged = block if merged is None else merge_blocks(merged, block)
    want = whole[:, :, first:last]
    assert relative_error(merged[0], want) < 1e-12 and torch.isfinite(merged[0]).all()
    _gradients_agree(merged[0], want, [q, k, v, table] if with_bias else [q, k, v], 1e-10)


def test_rotary_scores_depend_on_the_offset_only():
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    rotated_q, rotated_k = rotary(q.expand(20, 8)), rotary(k.expand(20, 8))
    scores = rotated_q @ rotated_k.t()
    for offset in (0, 3, -5):
        diagonal = torch.diagonal(scores, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))
    assert not torch.allclose(torch.diagonal(scores, 0)[:1], torch.diagonal(scores, 3)[:1])


def test_rotary_with_an_offset_per_row_places_each_row_as_its_own_int_offset():
    x = torch.randn(3, 2, 5, 8, dtype=torch.float64)  # (batch, heads, n, width)
    offsets = torch.tensor([0, 7, 1000])
    expected = torch.stack([rotary(x[row], int(offset)) for row, offset in enumerate(offsets)])
    torch.testing.assert_close(rotary(x, offsets), expected, rtol=0, atol=1e-12)
