"""The online (relaxed, tiled) causal Toeplitz product against explicit references."""

import pytest
import torch
from conftest import LENGTHS, relative_error

from tokenmix.ops import online_toeplitz
from tokenmix.ops.fft import fast_fft_size
from tokenmix.ops.online_toeplitz import (
    TileKernels,
    empty_state,
    naive_online_step,
    online_step,
    prefill_state,
    required_lags,
    tile_contribution,
)
from tokenmix.ops.toeplitz import naive_toeplitz_matvec


def _inputs(length, batch=2, dim=3):
    return torch.randn(batch, length, dim, dtype=torch.float64), torch.randn(required_lags(length), dim, dtype=torch.float64)


def _stepped(x, taps, state=None):
    kernels = TileKernels(taps)
    state = state or empty_state(x.shape[0], x.shape[2], dtype=x.dtype)
    outputs = torch.stack([online_step(state, x[:, t], kernels) for t in range(x.shape[1])], dim=1)
    return outputs, state


@pytest.mark.parametrize("n", LENGTHS)
def test_stepping_equals_the_explicit_toeplitz_product(n):
    x, taps = _inputs(n)
    outputs, _ = _stepped(x, taps)
    assert relative_error(outputs, naive_toeplitz_matvec(x, taps[:n], causal=True)) < 1e-12


@pytest.mark.parametrize("n", [*LENGTHS, 256])
def test_rows_told_their_ends_get_the_same_outputs_before_them_and_no_work_past_the_furthest(n):
    """``limit_steps`` after a prefill: every row's outputs before its own end equal the explicit product,
    and no tile of ``LIMITED_TILE_MIN`` inputs or more added anything past the furthest end (a row told
    nothing has pending sums there)."""
    x, taps = _inputs(n, batch=3)
    kernels, start = TileKernels(taps), n // 3
    state = prefill_state(x[:, :start], kernels)
    steps = torch.tensor([0, (n - start) // 2, n - start])
    state = state.limit_steps(steps)
    outputs = torch.stack([online_step(state, x[:, t], kernels) for t in range(start, n)], dim=1)
    expected = naive_toeplitz_matvec(x, taps[:n], causal=True)[:, start:]
    for row, count in enumerate(steps.tolist()):
        assert relative_error(outputs[row, :count], expected[row, :count]) < 1e-12
    assert not state.pending[:, n + online_toeplitz.LIMITED_TILE_MIN - 1 :].any()
    assert n < online_toeplitz.LIMITED_TILE_MIN or state.pending.shape[1] < 2 * n  # no room made for a cut tile's outputs
    whole, _ = _stepped(x, taps, told_nothing := empty_state(3, 3, dtype=x.dtype))
    assert relative_error(whole, naive_toeplitz_matvec(x, taps[:n], causal=True)) < 1e-12
    assert told_nothing.pending[:, n:].any()


def test_ends_follow_their_rows_and_bad_step_counts_are_refused():
    x, taps = _inputs(20, batch=3)
    state = prefill_state(x, TileKernels(taps)).limit_steps(torch.tensor([1, 2, 3]))
    assert state.select([2, 0]).ends.tolist() == [23, 21]
    joined = type(state).concat([state, prefill_state(x[:2], TileKernels(taps))])
    assert joined.ends.tolist() == [21, 22, 23, online_toeplitz.NO_END, online_toeplitz.NO_END]
    assert joined.assign([3], state.select([1])).ends.tolist() == [21, 22, 23, 22, online_toeplitz.NO_END]
    for bad in (torch.tensor([1, 2]), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([[1, 2, 3]])):
        with pytest.raises(ValueError, match="steps must be 3 integer step counts"):
            state.limit_steps(bad)


def test_the_direct_reference_equals_the_explicit_product():
    x, taps = _inputs(50)
    direct = torch.stack([naive_online_step(x[:, : t + 1], taps) for t in range(50)], dim=1)
    assert relative_error(direct, naive_toeplitz_matvec(x, taps[:50], causal=True)) < 1e-12


@pytest.mark.parametrize("rows_together", [None, 3])
@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize(("batch", "size"), [(1, 1), (1, 4), (1, 8), (1, 16), (2, 256), (64, 64), (64, 128)])
def test_a_tile_adds_its_block_to_the_outputs_after_it(batch, size, cut, rows_together, monkeypatch):
    """Both ways of ``direct_tile`` (direct up to 8 inputs for one row, 64 for 64 rows; FFT beyond), the
    FFTs over the whole batch or over groups of ``rows_together`` rows (``fft_rows``); a tile cut to
    its first M outputs (the rows' ends, ``limit_steps``), by FFT at the fast size past B + M."""
    outputs = size // 3 + 1 if cut else size
    block, taps = torch.randn(batch, size, 3, dtype=torch.float64), torch.randn(2 * size, 3, dtype=torch.float64)
    points = 2 * size if outputs == size else fast_fft_size(size + outputs)
    if rows_together:
        monkeypatch.setattr(online_toeplitz, "FFT_GROUP_POINTS", rows_together * points * 3)
        assert online_toeplitz.fft_rows(block, points) == rows_together
    expected = torch.stack([sum(block[:, r] * taps[size + m - r] for r in range(size)) for m in range(outputs)], dim=1)
    assert relative_error(tile_contribution(block, TileKernels(taps), outputs if cut else None), expected) < 1e-12


def test_direct_tiles_grow_with_the_square_root_of_the_batch():
    limit = online_toeplitz.DIRECT_TILE_MAX
    assert online_toeplitz.direct_tile(limit, 1) and not online_toeplitz.direct_tile(limit + 1, 1)
    assert online_toeplitz.direct_tile(8 * limit, 64) and not online_toeplitz.direct_tile(8 * limit + 1, 64)


def _same_state(a, b):
    assert a.position == b.position
    capacity = max(a.inputs.shape[1], b.inputs.shape[1])
    for name in ("inputs", "pending"):
        left, right = (torch.nn.functional.pad(getattr(s, name), (0, 0, 0, capacity - getattr(s, name).shape[1])) for s in (a, b))
        assert relative_error(left, right) < 1e-12 or float(right.abs().max()) == 0.0 == float(left.abs().max())


@pytest.mark.parametrize("n", LENGTHS)
def test_a_prefill_leaves_the_state_of_as_many_steps(n):
    x, taps = _inputs(n + 50)
    _, stepped = _stepped(x[:, :n], taps)
    prefilled = prefill_state(x[:, :n], TileKernels(taps))
    _same_state(prefilled, stepped)
    continued, _ = _stepped(x[:, n:], taps, prefilled)
    assert relative_error(continued, naive_toeplitz_matvec(x, taps[: n + 50], causal=True)[:, n:]) < 1e-12


def test_float32_stepping_stays_within_float32_round_off():
    x, taps = (tensor.float() for tensor in _inputs(300))
    outputs, _ = _stepped(x, taps)
    assert outputs.dtype == torch.float32
    assert relative_error(outputs.double(), naive_toeplitz_matvec(x.double(), taps[:300].double(), causal=True)) < 1e-5


def test_taps_that_do_not_reach_far_enough_are_refused():
    x, taps = _inputs(10)
    state = empty_state(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="taps must cover lags 0 ... 1 at position 0"):
        online_step(state, x[:, 0], TileKernels(taps[:1]))
    with pytest.raises(ValueError, match="for 10 inputs"):
        prefill_state(x, TileKernels(taps[:5]))


def test_bad_capacities_and_complex_taps_are_refused():
    with pytest.raises(ValueError, match="capacity must be an integer >= 1"):
        empty_state(1, 3, capacity=0)
    with pytest.raises(ValueError, match="real floating point"):
        TileKernels(torch.randn(8, 3, dtype=torch.complex64))
