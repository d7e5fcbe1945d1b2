"""The online (relaxed, tiled) causal Toeplitz product against explicit references."""

import pytest
import torch
from conftest import LENGTHS, relative_error

from tokenmix.ops import online_toeplitz
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


def test_the_direct_reference_equals_the_explicit_product():
    x, taps = _inputs(50)
    direct = torch.stack([naive_online_step(x[:, : t + 1], taps) for t in range(50)], dim=1)
    assert relative_error(direct, naive_toeplitz_matvec(x, taps[:50], causal=True)) < 1e-12


@pytest.mark.parametrize("rows_together", [None, 3])
@pytest.mark.parametrize(("batch", "size"), [(1, 1), (1, 4), (1, 8), (1, 16), (2, 256), (64, 64), (64, 128)])
def test_a_tile_adds_its_block_to_the_outputs_after_it(batch, size, rows_together, monkeypatch):
    """Both ways of ``direct_tile`` (direct up to 8 inputs for one row, 64 for 64 rows; FFT beyond), the
    FFTs over the whole batch or over groups of ``rows_together`` rows (``fft_rows``)."""
    block, taps = torch.randn(batch, size, 3, dtype=torch.float64), torch.randn(2 * size, 3, dtype=torch.float64)
    if rows_together:
        monkeypatch.setattr(online_toeplitz, "FFT_GROUP_POINTS", rows_together * 2 * size * 3)
        assert online_toeplitz.fft_rows(block) == rows_together
    expected = torch.stack([sum(block[:, r] * taps[size + m - r] for r in range(size)) for m in range(size)], dim=1)
    assert relative_error(tile_contribution(block, TileKernels(taps)), expected) < 1e-12


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
