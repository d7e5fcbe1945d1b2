import os
from pathlib import Path

import pytest
import torch
from conftest import LENGTHS, assert_causal_gradient, relative_error

from tokenmix.ops import (
    circulant_layout,
    fast_fft_size,
    naive_toeplitz_matrix,
    naive_toeplitz_matvec,
    toeplitz_matvec,
)
from tokenmix.ops.layout import channels_first, naive_channels_first
from tokenmix.ops.toeplitz import complex_readout, factored_spectral_matvec, spectral_matvec


def _even_5_smooth(size: int) -> bool:
    if size % 2:
        return False
    for radix in (2, 3, 5):
        while size % radix == 0:
            size //= radix
    return size == 1


def test_fast_fft_size_is_the_smallest_even_5_smooth_size():
    for minimum in range(1, 600):
        size = fast_fft_size(minimum)
        assert size >= minimum and _even_5_smooth(size)
        assert not any(_even_5_smooth(smaller) for smaller in range(minimum, size))
    with pytest.raises(ValueError, match="minimum"):
        fast_fft_size(0)


def test_circulant_layout_places_each_lag():
    n, size = 4, 10
    kernel = torch.arange(-(n - 1), n, dtype=torch.float64)[:, None]  # value == lag
    column = circulant_layout(kernel, n, size, causal=False)[:, 0]
    assert column.tolist() == [0, 1, 2, 3, 0, 0, 0, -3, -2, -1]
    causal = circulant_layout(kernel, n, size, causal=True)[:, 0]
    assert causal.tolist() == [0, 1, 2, 3, 0, 0, 0, 0, 0, 0]


def test_naive_matrix_is_toeplitz():
    kernel = torch.randn(9, 2, dtype=torch.float64)
    matrix = naive_toeplitz_matrix(kernel, 5, causal=False)
    for i in range(5):
        for j in range(5):
            assert matrix[:, i, j].tolist() == kernel[i - j + 4].tolist()
    assert torch.all(naive_toeplitz_matrix(kernel, 5, causal=True).triu(1) == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", LENGTHS)
def test_matches_dense_reference_forward_and_gradients(n, causal):
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(2 * n - 1, 3, dtype=torch.float64, requires_grad=True)
    fast, slow = toeplitz_matvec(x, kernel, causal), naive_toeplitz_matvec(x, kernel, causal)
    assert relative_error(fast, slow) < 1e-12
    grad = torch.randn_like(fast)
    for a, b in zip(torch.autograd.grad(fast, (x, kernel), grad), torch.autograd.grad(slow, (x, kernel), grad), strict=True):
        assert relative_error(a, b) < 1e-12


@pytest.mark.parametrize("n", [7, 100])
def test_float32_and_causal_short_kernel(n):
    x = torch.randn(2, n, 4)
    kernel = torch.randn(n, 4)  # lags 0..n-1 only
    fast = toeplitz_matvec(x, kernel, causal=True)
    assert fast.dtype == torch.float32
    assert relative_error(fast, naive_toeplitz_matvec(x.double(), kernel.double(), True).float()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_in_float32_and_returns_input_dtype(dtype):
    x = torch.randn(2, 50, 4)
    kernel = torch.randn(99, 4)
    out = toeplitz_matvec(x.to(dtype), kernel, causal=False)
    assert out.dtype == dtype
    assert relative_error(out.float(), naive_toeplitz_matvec(x.to(dtype).float(), kernel, False)) < 2e-2


def test_causal_gradient_never_reaches_the_future():
    n = 50
    x = torch.randn(1, n, 2, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(2 * n - 1, 2, dtype=torch.float64)
    out = toeplitz_matvec(x, kernel, causal=True)
    (grad,) = torch.autograd.grad(out[0, 20].sum(), x)
    assert_causal_gradient(grad, 20)
    assert torch.all(grad[0, :21].abs().sum(-1) > 0)


def test_bad_kernel_shapes_raise():
    x = torch.randn(1, 5, 2)
    with pytest.raises(ValueError, match="lag rows"):
        toeplitz_matvec(x, torch.randn(5, 2), causal=False)
    with pytest.raises(ValueError, match="channels"):
        toeplitz_matvec(x, torch.randn(9, 3), causal=False)
    with pytest.raises(ValueError, match="batch, length, channels"):
        toeplitz_matvec(torch.randn(5, 2), torch.randn(9, 2), causal=False)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("batch", "n", "d", "length"), [(1, 1000, 1100, 2000), (3, 700, 600, 1500), (2, 300, 2000, 300)])
def test_channels_first_equals_the_plain_transposed_copy(batch, n, d, length, threads):
    """Sizes above the blocked path's threshold, lengths not a multiple of its token block."""
    x = torch.randn(batch, n, d)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.equal(channels_first(x, length), naive_channels_first(x, length))
    finally:
        torch.set_num_threads(previous)
    with pytest.raises(ValueError, match="length must be"):
        channels_first(x, n - 1)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts the process's threads under /proc (Linux)")
def test_channels_first_leaves_no_threads_behind():
    """Torch ops run from other live threads give each an OpenMP team of its own; once a process holds
    more OpenMP threads than CPUs, libgomp stops spinning and every later small operation slows 3-5x
    (``ops/layout.py``). The blocked path runs in the caller's thread and leaves the count as it was."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1, 4096, 384)
        naive_channels_first(x, 8192)  # the calling thread's own OpenMP team exists before the count
        before = len(os.listdir("/proc/self/task"))
        channels_first(x, 8192)
        assert len(os.listdir("/proc/self/task")) == before
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("n", LENGTHS)
def test_factored_product_equals_the_product_of_its_spectrum(n):
    """K = R^T S inside the fused op == the differentiable composition complex_readout then spectral_matvec."""
    fft_size = fast_fft_size(2 * n)
    x = torch.randn(2, n, 5, dtype=torch.float64, requires_grad=True)
    basis = torch.randn(3, fft_size // 2 + 1, dtype=torch.complex128, requires_grad=True)
    readout = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    fast = factored_spectral_matvec(x, basis, readout, fft_size)
    slow = spectral_matvec(x, complex_readout(basis, readout), fft_size)
    assert relative_error(fast, slow) < 1e-12
    grad = torch.randn_like(fast)
    for a, b in zip(
        torch.autograd.grad(fast, [x, basis, readout], grad), torch.autograd.grad(slow, [x, basis, readout], grad), strict=True
    ):
        assert relative_error(a, b) < 1e-11
