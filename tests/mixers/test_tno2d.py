"""The 2-D Toeplitz product, the tno2d and separable2d mixers and the tnn2d model against explicit matrices."""

import json

import pytest
import torch
from conftest import relative_error

import tokenmix
from tokenmix.mixers.registry import resolve_mixer_options
from tokenmix.mixers.ski_tno import SkiTno
from tokenmix.models import ModelConfig
from tokenmix.ops import naive_toeplitz_matrix
from tokenmix.ops.toeplitz2d import naive_toeplitz2d_matrix, naive_toeplitz2d_matvec, near_square_grid, toeplitz2d_matvec

GRIDS = [(1, 1), (1, 7), (7, 1), (3, 5), (7, 9), (10, 10), (16, 16)]
SMALL = {"rpe_dim": 4, "rpe_layers": 1}


def dense(matrix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(d, n, n) matrices times x (batch, n, d)."""
    return torch.einsum("dij,bjd->bid", matrix, x)


def assert_same_forward_and_gradients(fast, slow, inputs, tolerance=1e-10):
    assert relative_error(fast, slow) < tolerance
    grad = torch.randn_like(fast)
    for a, b in zip(torch.autograd.grad(fast, inputs, grad), torch.autograd.grad(slow, inputs, grad), strict=True):
        assert relative_error(a, b) < tolerance


# --- the operator --------------------------------------------------------------------------------
def test_naive_matrix_is_block_toeplitz_with_toeplitz_blocks():
    rows, columns = 3, 4
    kernel = torch.randn(2 * rows - 1, 2 * columns - 1, 2, dtype=torch.float64)
    matrix = naive_toeplitz2d_matrix(kernel)
    for i in range(rows):
        for j in range(columns):
            for k in range(rows):
                for m in range(columns):
                    expected = kernel[i - k + rows - 1, j - m + columns - 1]
                    assert matrix[:, i * columns + j, k * columns + m].tolist() == expected.tolist()


@pytest.mark.parametrize("grid", GRIDS)
def test_fft_product_matches_the_explicit_matrix_forward_and_gradients(grid):
    rows, columns = grid
    x = torch.randn(2, rows * columns, 3, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(2 * rows - 1, 2 * columns - 1, 3, dtype=torch.float64, requires_grad=True)
    assert_same_forward_and_gradients(toeplitz2d_matvec(x, kernel), naive_toeplitz2d_matvec(x, kernel), (x, kernel), 1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_in_float32_and_returns_the_input_dtype(dtype):
    x, kernel = torch.randn(2, 35, 4), torch.randn(9, 13, 4)
    y = toeplitz2d_matvec(x.to(dtype), kernel)
    assert y.dtype == dtype and relative_error(y.float(), naive_toeplitz2d_matvec(x.to(dtype).float(), kernel)) < 2e-2


def test_a_one_row_grid_is_the_1d_toeplitz_product():
    x, kernel = torch.randn(2, 9, 3, dtype=torch.float64), torch.randn(1, 17, 3, dtype=torch.float64)
    torch.testing.assert_close(toeplitz2d_matvec(x, kernel), dense(naive_toeplitz_matrix(kernel[0], 9, causal=False), x))


def test_bad_kernel_or_input_shapes_are_refused():
    with pytest.raises(ValueError, match="odd sizes"):
        toeplitz2d_matvec(torch.randn(1, 12, 2), torch.randn(6, 7, 2))
    with pytest.raises(ValueError, match="H \\* W = 12"):
        toeplitz2d_matvec(torch.randn(1, 11, 2), torch.randn(5, 7, 2))


@pytest.mark.parametrize(("length", "grid"), [(1, (1, 1)), (2, (1, 2)), (7, (3, 3)), (17, (4, 5)), (1000, (32, 32)), (1024, (32, 32))])
def test_near_square_grid(length, grid):
    assert near_square_grid(length) == grid


def test_square_lengths_get_square_grids():
    assert all(near_square_grid(side * side) == (side, side) for side in range(1, 200))


# --- tno2d ---------------------------------------------------------------------------------------
def tno2d(**options):
    return tokenmix.build_mixer("tno2d", 4, **{**SMALL, **options}).double()


def test_kernel_is_the_decayed_rpe_of_the_offset():
    mixer = tno2d(decay=0.9)
    kernel = mixer.kernel((3, 4))  # offsets -2..2 by -3..3
    for di, dj in [(0, 0), (1, -2), (-2, 3), (2, 0)]:
        expected = 0.9 ** (abs(di) + abs(dj)) * mixer.rpe(torch.tensor([[float(di), float(dj)]], dtype=torch.float64))[0]
        torch.testing.assert_close(kernel[di + 2, dj + 3], expected)


def test_impulse_response_is_the_kernel_around_the_impulse():
    """y[i, j] = t[i - 2, j - 1] for a unit impulse at (2, 1): orientation and sign of both offsets."""
    mixer, (rows, columns) = tno2d(), (4, 5)
    x = torch.zeros(1, rows * columns, 4, dtype=torch.float64)
    x[0, 2 * columns + 1] = 1.0
    y = mixer(x, grid=(rows, columns)).reshape(rows, columns, 4)
    kernel = mixer.kernel((rows, columns))
    for i in range(rows):
        for j in range(columns):
            torch.testing.assert_close(y[i, j], kernel[i - 2 + rows - 1, j - 1 + columns - 1])


@pytest.mark.parametrize("grid", GRIDS)
def test_tno2d_matches_the_matrix_of_its_own_kernel(grid):
    mixer = tno2d(grid=grid)
    x = torch.randn(2, grid[0] * grid[1], 4, dtype=torch.float64, requires_grad=True)
    slow = dense(naive_toeplitz2d_matrix(mixer.kernel(grid)), x)
    assert_same_forward_and_gradients(mixer(x), slow, (x, *mixer.parameters()))


@pytest.mark.parametrize("n", [1, 7, 30, 100])
def test_any_length_lies_on_a_near_square_grid_with_the_tail_cut_off(n):
    mixer = tno2d()
    x = torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True)
    grid = near_square_grid(n)
    slow = dense(naive_toeplitz2d_matrix(mixer.kernel(grid))[:, :n, :n], x)
    assert_same_forward_and_gradients(mixer(x), slow, (x, *mixer.parameters()))
    torch.testing.assert_close(mixer.operator_matrices(n)["T"], naive_toeplitz2d_matrix(mixer.kernel(grid))[:, :n, :n])


def test_padded_positions_are_zeroed_before_mixing():
    mixer, grid = tno2d(grid=(5, 6)), (5, 6)
    x = torch.randn(2, 30, 4, dtype=torch.float64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[0, 22:] = False
    mask[1, :4] = False
    expected = dense(naive_toeplitz2d_matrix(mixer.kernel(grid)), x * mask[..., None])
    torch.testing.assert_close(mixer(x, mask), expected)


def test_decay_one_turns_the_bias_off():
    mixer, plain = tno2d(decay=0.8), tno2d(decay=1.0)
    plain.load_state_dict(mixer.state_dict())
    offsets = mixer.offsets((3, 3))
    torch.testing.assert_close(mixer.kernel((3, 3)), 0.8 ** offsets.abs().sum(-1)[..., None] * plain.kernel((3, 3)))
    torch.testing.assert_close(plain.kernel((3, 3)), plain.rpe(offsets))


def test_eval_spectrum_cache_follows_the_grid_and_the_weights():
    mixer = tno2d().eval()
    x = torch.randn(1, 12, 4, dtype=torch.float64)
    with torch.no_grad():
        wide, tall = mixer(x, grid=(2, 6)), mixer(x, grid=(6, 2))
        assert not torch.allclose(wide, tall)
        torch.testing.assert_close(mixer(x, grid=(2, 6)), wide)
        mixer.rpe.output.bias.add_(1.0)
        assert not torch.allclose(mixer(x, grid=(2, 6)), wide)


# --- the grid option -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tno2d", "separable2d"])
def test_a_fixed_grid_refuses_other_lengths_and_a_per_call_grid_overrides_it(name):
    mixer = tokenmix.build_mixer(name, 4, grid=(4, 8), **SMALL).double()
    x = torch.randn(2, 32, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"grid=\[4, 8\] holds 32 tokens but the sequence has length 30"):
        mixer(x[:, :30])
    torch.testing.assert_close(mixer(x), mixer(x, grid=[4, 8]))
    tall = tokenmix.build_mixer(name, 4, grid=(8, 4), **SMALL).double()
    tall.load_state_dict(mixer.state_dict())
    torch.testing.assert_close(mixer(x, grid=(8, 4)), tall(x))
    assert not torch.allclose(tall(x), mixer(x))
    with pytest.raises(ValueError, match="length 32"):
        mixer(x, grid=(5, 7))


@pytest.mark.parametrize("grid", [(0, 4), (4,), (2, 3, 4), "32x32", (2.0, 3), (True, 3), 32])
@pytest.mark.parametrize("name", ["tno2d", "separable2d"])
def test_bad_grids_are_refused_by_name(name, grid):
    with pytest.raises(ValueError, match="grid must be None or two positive integers"):
        tokenmix.build_mixer(name, 4, grid=grid)
    with pytest.raises(ValueError, match="grid must be None or two positive integers"):
        tokenmix.build_mixer(name, 4)(torch.randn(1, 6, 4), grid=grid)


@pytest.mark.parametrize("name", ["tno2d", "separable2d"])
def test_there_is_no_causal_mode(name):
    with pytest.raises(ValueError, match="no causal mode"):
        tokenmix.build_mixer(name, 4, causal=True)


def test_grid_is_recorded_as_json_holds_it():
    assert resolve_mixer_options("tno2d", {"grid": (32, 32)}, 8)["grid"] == [32, 32]
    assert resolve_mixer_options("separable2d", {}, 8)["grid"] is None


# --- separable2d ---------------------------------------------------------------------------------
AXIS_OPTIONS = {"tno": SMALL, "fd_tno": SMALL, "ski_tno": {"rank": 4, "knots": 3, "filter_size": 3}}


def axis_reference(mixer, n: int) -> torch.Tensor:
    """The explicit (d, n, n) matrix of a 1-D axis mixer from its own kernel (SKI-TNO: band + W A W^T)."""
    return mixer.matrix(n) if isinstance(mixer, SkiTno) else naive_toeplitz_matrix(mixer.kernel(n), n, causal=False)


@pytest.mark.parametrize("grid", [(1, 1), (1, 7), (7, 1), (3, 5), (7, 9), (8, 8)])
@pytest.mark.parametrize("axis_mixer", ["tno", "ski_tno", "fd_tno"])
def test_separable2d_is_the_kronecker_product_of_its_axis_operators(axis_mixer, grid):
    mixer = tokenmix.build_mixer("separable2d", 4, grid=grid, axis_mixer=axis_mixer, **AXIS_OPTIONS[axis_mixer]).double()
    rows, columns = grid
    column_matrix, row_matrix = axis_reference(mixer.columns, rows), axis_reference(mixer.rows, columns)
    matrix = torch.einsum("cik,cjl->cijkl", column_matrix, row_matrix).reshape(4, rows * columns, rows * columns)
    x = torch.randn(2, rows * columns, 4, dtype=torch.float64, requires_grad=True)
    assert_same_forward_and_gradients(mixer(x), dense(matrix, x), (x, *mixer.parameters()))
    torch.testing.assert_close(mixer.operator_matrices(rows * columns)["T"], matrix)


def test_separable2d_with_padding_and_a_near_square_grid():
    mixer = tokenmix.build_mixer("separable2d", 4, **SMALL).double()
    x = torch.randn(2, 23, 4, dtype=torch.float64)
    mask = torch.ones(2, 23, dtype=torch.bool)
    mask[0, 15:] = False
    rows, columns = near_square_grid(23)
    matrix = torch.einsum("cik,cjl->cijkl", axis_reference(mixer.columns, rows), axis_reference(mixer.rows, columns))
    expected = dense(matrix.reshape(4, rows * columns, rows * columns)[:, :23, :23], x * mask[..., None])
    torch.testing.assert_close(mixer(x, mask), expected)


def test_separable2d_records_every_option_of_its_axis_mixer():
    resolved = resolve_mixer_options("separable2d", {"axis_mixer": "ski_tno", "rank": 32, "filter_size": 16}, 8)
    axis = {"name": "ski_tno", **resolve_mixer_options("ski_tno", {"rank": 32, "filter_size": 16}, 8)}
    assert resolved == {"grid": None, "axis_mixer": axis}
    with pytest.raises(ValueError, match="axis_mixer must be one of"):
        tokenmix.build_mixer("separable2d", 4, axis_mixer="attention")
    with pytest.raises(ValueError, match="unknown option 'rank'"):
        tokenmix.build_mixer("separable2d", 4, rank=8)  # a ski_tno option, but the axis mixer is tno


# --- the tnn2d model -----------------------------------------------------------------------------
def test_tnn2d_classifies_a_32x32_grid_and_trains():
    model = tokenmix.build_model("tnn2d", task="classify", vocab_size=256, num_classes=10, grid=(32, 32), dim=8, depth=2, **SMALL)
    tokens = torch.randint(0, 256, (2, 1024))
    logits = model(tokens)
    assert logits.shape == (2, 10)
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with pytest.raises(ValueError, match="length 1000"):
        model(tokens[:, :1000])


def test_tnn2d_config_survives_json_and_equals_tnn_with_tno2d(tmp_path):
    config = tokenmix.build_model("tnn2d", task="classify", vocab_size=256, num_classes=10, grid=(32, 32), dim=8, depth=1).config
    assert config.options["mixer"]["grid"] == [32, 32] and config.options["mixer"]["name"] == "tno2d"
    assert ModelConfig.from_dict(json.loads(config.to_json())) == config
    via_tnn = tokenmix.build_model("tnn", task="classify", vocab_size=256, num_classes=10, mixer="tno2d", grid=(32, 32), dim=8, depth=1)
    assert via_tnn.config.options == config.options
    with pytest.raises(ValueError, match="no causal mode"):
        tokenmix.build_model("tnn", task="lm", vocab_size=256, mixer="tno2d", dim=8, depth=1)
