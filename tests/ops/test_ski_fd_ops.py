"""Ops of SKI-TNN / FD-TNN (Moreno et al. 2023): interpolation, banded product, SKI low rank, Hilbert transform, Theorem 1."""

import math
from unittest.mock import patch

import pytest
import torch
from conftest import LENGTHS, relative_error
from torch.autograd import gradgradcheck

from tokenmix.ops.band import band_matvec, naive_band_matvec
from tokenmix.ops.hilbert import causal_impulse_response, causal_spectrum, naive_causal_spectrum
from tokenmix.ops.interpolation import grid_weights
from tokenmix.ops.ski import (
    dense_interpolation,
    inducing_spacing,
    naive_ski_matrix,
    ski_dense_matvec,
    ski_linear_matvec,
    ski_sparse_matvec,
    ski_weights,
    toeplitz_blocks,
)


@pytest.mark.parametrize("degree", [1, 3])
def test_grid_weights_reproduce_polynomials_of_their_degree(degree):
    grid = torch.arange(10, dtype=torch.float64)
    queries = torch.rand(200, dtype=torch.float64) * 9
    index, weight = grid_weights(queries, 10, degree)
    assert index.shape == (200, degree + 1)
    torch.testing.assert_close(weight.sum(1), torch.ones(200, dtype=torch.float64))
    polynomial = lambda u: 0.3 - 1.2 * u + (0.05 * u**3 if degree == 3 else 0)  # noqa: E731
    interpolated = (weight * polynomial(grid)[index]).sum(1)
    torch.testing.assert_close(interpolated, polynomial(queries))


def test_linear_interpolation_matrix_is_the_hat_function():
    """W_ij = max(0, 1 - |i / h - j|): two non-zeros per row, the correct neighbours (the authors' released code picks the wrong one)."""
    n, rank = 100, 8
    count, spacing = inducing_spacing(n, rank)
    grid = torch.arange(n, dtype=torch.float64)[:, None] / spacing - torch.arange(count, dtype=torch.float64)
    hats = (1 - grid.abs()).clamp_min(0)
    torch.testing.assert_close(dense_interpolation(n, rank, 1), hats)
    assert int((dense_interpolation(n, rank, 1) != 0).sum(1).max()) == 2
    assert int((dense_interpolation(n, rank, 3) != 0).sum(1).max()) == 4


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("min_lag", [-3, 0])
def test_band_matvec_matches_explicit_band(n, min_lag):
    x = torch.randn(2, n, 5, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    fast, slow = band_matvec(x, taps, min_lag), naive_band_matvec(x, taps, min_lag)
    assert relative_error(fast, slow) < 1e-12
    grad = torch.randn_like(fast)
    for a, b in zip(torch.autograd.grad(fast, [x, taps], grad), torch.autograd.grad(slow, [x, taps], grad), strict=True):
        assert relative_error(a, b) < 1e-12


def test_band_matvec_rejects_bad_shapes():
    with pytest.raises(ValueError, match="taps"):
        band_matvec(torch.randn(1, 4, 3), torch.randn(2, 5), -2)
    with pytest.raises(ValueError, match="min_lag"):
        band_matvec(torch.randn(1, 4, 3), torch.randn(3, 5), 1)


@pytest.mark.parametrize("fft_size", [2, 4, 14, 64, 2048])
def test_causal_spectrum_matches_definition_1_and_keeps_the_real_part(fft_size):
    response = torch.randn(3, fft_size // 2 + 1, dtype=torch.float64)
    fast = causal_spectrum(response, fft_size)
    assert relative_error(fast, naive_causal_spectrum(response, fft_size)) < 1e-12
    torch.testing.assert_close(fast.real, response, rtol=0, atol=1e-12)
    taps = torch.fft.irfft(fast, n=fft_size, dim=-1)
    negative_lags = taps[:, fft_size // 2 + 1 :]
    assert negative_lags.numel() == 0 or float(negative_lags.abs().max()) < 1e-12 * float(taps.abs().max())
    torch.testing.assert_close(taps, causal_impulse_response(response, fft_size))


def test_causal_spectrum_rejects_a_wrong_grid():
    with pytest.raises(ValueError, match="frequencies"):
        causal_spectrum(torch.randn(2, 5), 16)


@pytest.mark.parametrize("degree", [1, 3])
@pytest.mark.parametrize("n", LENGTHS)
def test_ski_dense_and_sparse_paths_match_explicit_w_a_wt(n, degree):
    rank, d = 16, 4
    count = min(rank, n)
    kernel = torch.randn(2 * count - 1, d, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, n, d, dtype=torch.float64, requires_grad=True)
    w = dense_interpolation(n, rank, degree)
    reference = torch.einsum("dij,bjd->bid", naive_ski_matrix(w, toeplitz_blocks(kernel)), x)
    grad = torch.randn_like(reference)
    expected = torch.autograd.grad(reference, [x, kernel], grad)
    results = [ski_dense_matvec(x, w, kernel), ski_sparse_matvec(x, *ski_weights(n, rank, degree), kernel)]
    if degree == 1:
        results.append(ski_linear_matvec(x, kernel))
    for result in results:
        assert relative_error(result, reference) < 1e-12
        for a, b in zip(torch.autograd.grad(result, [x, kernel], grad), expected, strict=True):
            assert relative_error(a, b) < 1e-12


def test_dense_and_sparse_agree_in_float32():
    n, rank, d = 1000, 64, 8
    kernel, x = torch.randn(2 * rank - 1, d), torch.randn(2, n, d)
    dense = ski_dense_matvec(x, dense_interpolation(n, rank, 1).float(), kernel)
    sparse = ski_sparse_matvec(x, *ski_weights(n, rank, 1), kernel)
    assert relative_error(sparse, dense) < 1e-5
    assert relative_error(ski_linear_matvec(x, kernel), dense) < 1e-5


def _theorem_1_terms(n: int, rank: int, width: float):
    """Both sides of Theorem 1 (Moreno et al. 2023, §4.1) for k(t) = exp(-t^2 / (2 width^2)), linear interpolation."""
    kernel = lambda t: torch.exp(-(t**2) / (2 * width**2))  # noqa: E731
    count, spacing = inducing_spacing(n, rank)
    positions = torch.arange(n, dtype=torch.float64)
    points = torch.arange(count, dtype=torch.float64) * spacing
    t = kernel(positions[:, None] - positions[None, :])
    a = kernel(points[:, None] - points[None, :])
    f = kernel(positions[:, None] - points[None, :])
    b = f.t()
    u, s, vh = torch.linalg.svd(t)
    optimal = (u[:, :count] * s[:count]) @ vh[:count]
    w = dense_interpolation(n, rank, 1)
    error_ski = torch.linalg.matrix_norm(w @ a @ w.t() - optimal, ord=2)
    error_nystrom = torch.linalg.matrix_norm(f @ torch.linalg.solve(a, b) - optimal, ord=2)
    second_derivative_bound = 1 / width**2  # max |k''| of the Gaussian
    sigma = torch.linalg.svdvals
    factor = spacing**2 / 8  # |psi_N| / (N + 1)! for linear interpolation
    bound = (
        math.sqrt(n * count) * factor * second_derivative_bound * (2 * math.sqrt(n) + min(sigma(f)[0], sigma(b)[0]) / sigma(a)[-1])
        + error_nystrom
    )
    return float(error_ski), float(bound)


@pytest.mark.parametrize(("n", "rank", "width"), [(64, 8, 12.0), (128, 16, 10.0), (200, 12, 20.0), (256, 32, 9.0)])
def test_theorem_1_spectral_norm_bound_holds(n, rank, width):
    error, bound = _theorem_1_terms(n, rank, width)
    assert 0 < error <= bound


@pytest.mark.parametrize("degree", [1, 3])
def test_interpolation_pair_supports_double_backward(degree):
    """W and W^T (one autograd pair, each the other's backward) are constant linear maps, so their
    backward is differentiable again: second derivatives through the SKI low rank part are exact
    (A applied here by its dense matrix, to test the pair alone; tests/ops/test_double_backward.py has the FFT product)."""
    import functools

    from tokenmix.ops.ski import _gather, _interpolated_product, _linear_downsample, _linear_upsample, _scatter, ski_weights
    from tokenmix.ops.toeplitz import naive_toeplitz_matvec

    n, rank = 11, 4
    if degree == 1:
        restrict, prolong = functools.partial(_linear_downsample, count=rank), functools.partial(_linear_upsample, n=n)
    else:
        index, weight = ski_weights(n, rank, degree)
        restrict = functools.partial(_scatter, index=index, weight=weight, count=rank)
        prolong = functools.partial(_gather, index=index, weight=weight)

    def low_rank(x, kernel):
        with patch("tokenmix.ops.ski._apply_small", lambda k, z: naive_toeplitz_matvec(z, k.to(z.dtype), causal=False)):
            return _interpolated_product(x, kernel, restrict, prolong).square()

    x = torch.randn(1, n, 2, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(2 * rank - 1, 2, dtype=torch.float64, requires_grad=True)
    assert gradgradcheck(low_rank, (x, kernel))
