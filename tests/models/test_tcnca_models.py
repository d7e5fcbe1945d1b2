"""Mixers, blocks and models of TCNCA (Terzić et al. 2023) (TCN, EMA, attention; mega, tcnca, tcnca_simple, transformer)."""

import pytest
import torch
from conftest import relative_error

import tokenmix
from tokenmix.mixers.tcn import dilation_for, receptive_field
from tokenmix.ops.attention import chunk_mask, naive_attention


def _dependency_window(mixer, n: int, position: int) -> torch.Tensor:
    """Input positions whose gradient toward output ``position`` is non-zero."""
    x = torch.randn(1, n, mixer.dim, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(mixer(x)[:, position].sum(), x)
    return grad[0].abs().sum(-1).nonzero().flatten()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("kernel_size", "factor", "depth", "per_block"), [(3, 3, 2, 1), (5, 2, 3, 2), (4, 1, 3, 1), (17, 4, 2, 1)])
def test_tcn_dependency_window_equals_its_receptive_field(causal, kernel_size, factor, depth, per_block):
    options = dict(kernel_size=kernel_size, dilation_factor=factor, depth=depth, convs_per_block=per_block)
    tcn = tokenmix.build_mixer("tcn", 3, causal, **options).double()
    field = tcn.receptive_field
    assert field == 1 + per_block * (kernel_size - 1) * (depth if factor == 1 else (factor**depth - 1) // (factor - 1))
    n = 2 * field + 20
    position = field + 5
    window = _dependency_window(tcn, n, position)
    assert len(window) == field and int(window[-1] - window[0]) == field - 1
    if causal:
        assert int(window[-1]) == position
    else:
        assert int(window[0]) < position < int(window[-1])


def test_tcn_matches_an_explicit_loop_network():
    """Block i: x + act(conv(x)) with dilation f^i; each conv a plain loop over taps and positions."""
    tcn = tokenmix.build_mixer("tcn", 2, True, kernel_size=3, dilation_factor=2, depth=3).double()
    x = torch.randn(1, 40, 2, dtype=torch.float64)
    expected = x.clone()
    for block in range(3):
        conv = torch.zeros_like(expected)
        for i in range(40):
            for k in range(3):
                j = i - k * 2**block
                if j >= 0:
                    conv[:, i] += tcn.taps[block, :, k] * expected[:, j]
        expected = expected + torch.nn.functional.gelu(conv + tcn.bias[block])
    assert relative_error(tcn(x), expected) < 1e-12


def test_dilation_for_picks_the_smallest_covering_factor():
    for target in (2, 100, 8192, 131072):
        factor = dilation_for(target, 17, 4)
        assert receptive_field(17, factor, 4) >= target
        assert factor == 1 or receptive_field(17, factor - 1, 4) < target
    assert dilation_for(8192, 17, 4) == 8  # 1 + 16 * (8^4 - 1) / 7 = 9361


def test_auto_dilation_covers_every_length_and_receptive_field_option_fixes_it():
    auto = tokenmix.build_mixer("tcn", 2, True, kernel_size=17, depth=4, dilation_factor="auto")
    assert auto.receptive_field is None and auto.factor_for(8192) == 8 and auto.factor_for(131072) == dilation_for(131072, 17, 4)
    fixed = tokenmix.build_mixer("tcn", 2, True, kernel_size=3, depth=3, receptive_field=60)
    assert fixed.receptive_field >= 60 and fixed.dilation_factor == dilation_for(60, 3, 3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 7, 100, 1000, 1024])
def test_ema_fft_path_equals_the_recurrence_in_float32(causal, n):
    ema = tokenmix.build_mixer("ema", 8, causal, ndim=4)
    x = torch.randn(2, n, 8)
    with torch.no_grad():
        assert float((ema(x) - ema.naive_forward(x)).abs().max()) < 1e-5


def test_ema_gradients_match_the_recurrence():
    ema = tokenmix.build_mixer("ema", 3, False, ndim=2).double()
    x = torch.randn(1, 50, 3, dtype=torch.float64)
    fast = torch.autograd.grad(ema(x).pow(2).sum(), list(ema.parameters()))
    slow = torch.autograd.grad(ema.naive_forward(x).pow(2).sum(), list(ema.parameters()))
    for a, b in zip(fast, slow, strict=True):
        assert relative_error(a, b) < 1e-10


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("name", "chunk"), [("attention", None), ("chunked_attention", 16)])
def test_attention_mixer_matches_masked_attention_of_its_projections(name, causal, chunk):
    mixer = tokenmix.build_mixer(name, 8, causal, heads=2, position="none", **({"chunk_size": chunk} if chunk else {})).double()
    x = torch.randn(2, 50, 8, dtype=torch.float64)
    q, k, v = mixer.query_key_value(x).view(2, 50, 3, 2, 4).permute(2, 0, 3, 1, 4)
    expected = naive_attention(q, k, v, chunk_mask(50, chunk, causal)).transpose(1, 2).reshape(2, 50, 8)
    assert relative_error(mixer(x), mixer.out(expected)) < 1e-12


# Option variants beyond the defaults that test_contracts.py covers for every mixer.
PADDING_CASES = [("tcn", {"convs_per_block": 2})] + [(name, {"position": "bias"}) for name in ("attention", "chunked_attention")]


@pytest.mark.parametrize(("name", "options"), PADDING_CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_padding_cannot_reach_real_tokens(name, options, causal):
    mixer = tokenmix.build_mixer(name, 8, causal=causal, **options)
    x = torch.randn(2, 300, 8)
    mask = torch.ones(2, 300, dtype=torch.bool)
    mask[0, 200:] = False
    mask[1, :10] = False  # left padding too
    other = x.clone()
    other[~mask] = 100.0
    torch.testing.assert_close(mixer(x, mask)[mask], mixer(other, mask)[mask])


@pytest.mark.parametrize(
    ("name", "options", "argument"),
    [
        ("tcn", {"kernel_size": 0}, "kernel_size"),
        ("tcn", {"dilation_factor": "fast"}, "dilation_factor"),
        ("tcn", {"depth": 0}, "depth"),
        ("tcn", {"convs_per_block": 1.5}, "convs_per_block"),
        ("tcn", {"receptive_field": 0}, "receptive_field"),
        ("tcn", {"activation": "tanh"}, "activation"),
        ("ema", {"ndim": 0}, "ndim"),
        ("attention", {"heads": 3}, "heads"),
        ("attention", {"position": "absolute"}, "position"),
        ("chunked_attention", {"chunk_size": 0}, "chunk_size"),
        ("chunked_attention", {"chunk_size": None}, "chunk_size"),
    ],
)
def test_bad_options_raise_value_error(name, options, argument):
    with pytest.raises(ValueError, match=argument):
        tokenmix.build_mixer(name, 8, **options)


@pytest.mark.parametrize(
    ("name", "options", "argument"),
    [
        ("mega", {"sequence_mixer": "lstm"}, "sequence_mixer"),
        ("mega", {"sequence_mixer": "tno2d"}, "sequence_mixer"),  # mixes a grid, not a sequence
        ("mega", {"tcn_depth": 3}, "tcn_depth"),
        ("mega", {"z_dim": 0}, "z_dim"),
        ("tcnca", {"kernel_size": -1}, "kernel_size"),
        ("tcnca_simple", {"chunk_size": 0}, "chunk_size"),
        ("transformer", {"heads": 5}, "heads"),
    ],
)
def test_bad_model_options_raise_value_error(name, options, argument):
    with pytest.raises(ValueError, match=argument):
        tokenmix.build_model(name, vocab_size=10, dim=16, depth=1, **options)


def test_tcnca_is_the_mega_block_with_a_tcn():
    mega = tokenmix.build_model("mega", vocab_size=10, dim=16, depth=1)
    tcnca = tokenmix.build_model("tcnca", vocab_size=10, dim=16, depth=1, kernel_size=3, **{"sequence_mixer.depth": 3})
    assert type(mega.blocks[0]) is type(tcnca.blocks[0])
    assert type(mega.blocks[0].sequence).__name__ == "Ema" and type(tcnca.blocks[0].sequence).__name__ == "Tcn"
    assert tcnca.blocks[0].sequence.depth == 3
