"""2-D Toeplitz products on an H x W grid ("Toeplitz Neural Network for Sequence Modeling", Qin et
al., arXiv 2305.04749: the operator of its image model).

Per channel y[i, j] = sum_{i', j'} t[i - i', j - j'] x[i', j']. In the row-major flattening
(length H * W) the (HW) x (HW) matrix is block Toeplitz (blocks by i - i') with Toeplitz blocks
(entries by j - j'), given by the (2H - 1) x (2W - 1) offsets.

Kernels are laid out by offset, channels last: shape (2H - 1, 2W - 1, d), row a = di + H - 1 for
di = -(H-1) ... H-1, column b = dj + W - 1. The product is a 2-D linear convolution of x with that
array, whose full result holds y at rows H-1 ... 2H-2 and columns W-1 ... 2W-2. Circular
convolution at sizes N_H >= 2H - 1, N_W >= 2W - 1 wraps only the full result's indices >= N onto
indices < H - 1 (< W - 1), outside that window, so two 2-D real FFTs at fast sizes give y exactly,
in O(HW log HW) per channel. FFTs run in float32 (float64 stays float64); the result has x's dtype.
"""

from __future__ import annotations

import torch

from .fft import convolution_fft_size, spectral_dtype
from .forms import OpForms, register_op, without_state


def near_square_grid(length: int) -> tuple[int, int]:
    """(H, W) with W = ceil(sqrt(length)) and H = ceil(length / W): the smallest near-square row-major
    grid holding ``length`` tokens (exactly square for square lengths)."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    width = 1
    while width * width < length:  # ceil(sqrt(length)) by comparisons: under torch.compile, one graph per width
        width += 1
    return -(-length // width), width


def fft_grid(grid: tuple[int, int]) -> tuple[int, int]:
    """The FFT sizes (N_H, N_W): fast sizes >= (2H - 1, 2W - 1)."""
    return convolution_fft_size(2 * grid[0] - 1), convolution_fft_size(2 * grid[1] - 1)


def kernel_grid(kernel: torch.Tensor) -> tuple[int, int]:
    """The grid (H, W) of a by-offset kernel (2H - 1, 2W - 1, d); ValueError on other shapes."""
    if kernel.dim() != 3 or kernel.shape[0] % 2 == 0 or kernel.shape[1] % 2 == 0:
        raise ValueError(f"kernel must be (2H - 1, 2W - 1, channels) by offset (odd sizes), got shape {tuple(kernel.shape)}")
    return (kernel.shape[0] + 1) // 2, (kernel.shape[1] + 1) // 2


def toeplitz2d_spectrum(kernel: torch.Tensor, fft_shape: tuple[int, int]) -> torch.Tensor:
    """rfft2 of a by-offset kernel (2H - 1, 2W - 1, d) at ``fft_shape``, channels first: (d, N_H, N_W/2 + 1)."""
    layout = kernel.to(spectral_dtype(kernel.dtype)).permute(2, 0, 1)
    return torch.fft.rfft2(layout, s=fft_shape)


def spectral_matvec2d(x: torch.Tensor, spectrum: torch.Tensor, grid: tuple[int, int], fft_shape: tuple[int, int]) -> torch.Tensor:
    """Apply the operator of a (d, N_H, N_W/2 + 1) kernel spectrum to x (batch, H * W, d), row-major.

    The FFTs run on a contiguous channels-first (batch, d, H, W) copy (about 3x faster than across
    the channels-last layout); the output is a (batch, H * W, d) view of a channels-first result.
    """
    rows, columns = grid
    batch, _, channels = x.shape
    image = x.to(spectral_dtype(x.dtype)).transpose(1, 2).reshape(batch, channels, rows, columns).contiguous()
    full = torch.fft.irfft2(torch.fft.rfft2(image, s=fft_shape) * spectrum, s=fft_shape)
    y = full[..., rows - 1 : 2 * rows - 1, columns - 1 : 2 * columns - 1].reshape(batch, channels, rows * columns)
    return y.transpose(1, 2).to(x.dtype)


def toeplitz2d_matvec(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """y[i, j] = sum t[i - i', j - j'] x[i', j'] per channel by 2-D FFT; x (batch, H * W, d), kernel (2H - 1, 2W - 1, d)."""
    grid = kernel_grid(kernel)
    if x.dim() != 3 or x.shape[1] != grid[0] * grid[1] or x.shape[2] != kernel.shape[2]:
        raise ValueError(
            f"x must be (batch, H * W = {grid[0] * grid[1]}, {kernel.shape[2]}) for a kernel of grid {grid}, got shape {tuple(x.shape)}"
        )
    fft_shape = fft_grid(grid)
    return spectral_matvec2d(x, toeplitz2d_spectrum(kernel, fft_shape), grid, fft_shape)


def naive_toeplitz2d_matrix(kernel: torch.Tensor) -> torch.Tensor:
    """Explicit (d, HW, HW) matrices M[(i, j), (i', j')] = t[i - i', j - j'] (row-major flattening)."""
    rows, columns = kernel_grid(kernel)
    di = torch.arange(rows)[:, None] - torch.arange(rows)[None, :] + rows - 1
    dj = torch.arange(columns)[:, None] - torch.arange(columns)[None, :] + columns - 1
    matrix = kernel[di[:, None, :, None], dj[None, :, None, :]]  # (i, j, i', j', d)
    return matrix.permute(4, 0, 1, 2, 3).reshape(kernel.shape[2], rows * columns, rows * columns)


def naive_toeplitz2d_matvec(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Reference: the explicit (HW) x (HW) matrix per channel times x (batch, H * W, d) (tests only)."""
    return torch.einsum("dij,bjd->bid", naive_toeplitz2d_matrix(kernel), x)


def _grid_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    """A kernel on the (H, W) grid of the n tokens, H the largest divisor of n up to sqrt(n)."""
    rows = max(h for h in range(1, int(n**0.5) + 1) if n % h == 0)
    kernel = torch.randn(2 * rows - 1, 2 * (n // rows) - 1, dim, dtype=dtype, generator=generator)
    return torch.randn(batch, n, dim, dtype=dtype, generator=generator), {"kernel": kernel}, None


register_op(
    "toeplitz2d",
    OpForms(
        without_state(lambda x, params: naive_toeplitz2d_matvec(x, params["kernel"])),
        without_state(lambda x, params: toeplitz2d_matvec(x, params["kernel"])),
        None,
        _grid_example,
    ),
)
