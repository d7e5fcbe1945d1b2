"""Structured kernel interpolation of a Toeplitz matrix (SKI-TNN, Moreno et al. 2023, §3.2, Algorithm 1).

T_low = W A W^T per channel: r inducing points p_j = j h evenly spaced on [0, n - 1]
(h = (n - 1)/(r - 1); r = min(rank, n), so short sequences get W = I and the exact Toeplitz
matrix), W (n x r) the interpolation weights of position i between its neighbouring inducing points
(linear: 2 non-zeros per row, cubic: 4), and A_ij = k(p_i - p_j) a small r x r Toeplitz matrix.

Two ways to apply W A W^T to x (batch, n, d), equal to float round-off:
- dense: W materialised, two (r x n) x (n x d) matmuls per batch item, O(n r d);
- sparse, O(n s d): for linear interpolation W is exactly PyTorch's linear upsampling from r to n
  points with aligned corners (position i sits at i (r - 1)/(n - 1) = i/h on the inducing grid), so
  W z is ``F.interpolate`` and W^T x its adjoint, native kernels that keep the channels-last
  layout; for cubic, W^T is a scatter-add and W a gather with the s indices per row.
A is applied as a Toeplitz product by FFT (size >= 2r), O(r log r) per channel, in both.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .band import as_image, from_image
from .forms import OpForms, register_op, without_state
from .interpolation import grid_weights, interpolation_matrix
from .toeplitz import toeplitz_matvec


def inverse_time_warp(lags: torch.Tensor, decay: float) -> torch.Tensor:
    """x(t) = sign(t) * decay^|t| (Moreno et al. 2023, §3.2.2): every lag lands in [-1, 1], far lags near 0."""
    return torch.sign(lags) * decay ** lags.abs()


def inducing_spacing(n: int, rank: int) -> tuple[int, float]:
    """(r, h): the number of inducing points min(rank, n) and their spacing on [0, n - 1]."""
    count = min(rank, n)
    return count, (n - 1) / (count - 1) if count > 1 else 1.0


def ski_weights(n: int, rank: int, degree: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse rows of W: ``index`` (n, s) and ``weight`` (n, s) for positions 0..n-1."""
    count, spacing = inducing_spacing(n, rank)
    coordinates = torch.arange(n, device=device, dtype=torch.float64) / spacing
    index, weight = grid_weights(coordinates, count, degree)
    return index, weight


def inducing_lags(n: int, rank: int, device=None) -> torch.Tensor:
    """p_i - p_j for i - j = -(r - 1) ... r - 1: the lags A needs, (2r - 1,)."""
    count, spacing = inducing_spacing(n, rank)
    return torch.arange(-(count - 1), count, device=device, dtype=torch.float32) * spacing


def toeplitz_blocks(kernel: torch.Tensor) -> torch.Tensor:  # explicit A, for references and plots
    """(2r - 1, d) values by lag -> (d, r, r) matrices A_ij = k(i - j)."""
    count = (kernel.shape[0] + 1) // 2
    lags = torch.arange(count, device=kernel.device)
    return kernel[lags[:, None] - lags[None, :] + count - 1].permute(2, 0, 1)


def _apply_small(kernel: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """A z per channel, A_ij = k(i - j) given by lag (2r - 1, d): a small Toeplitz product by FFT."""
    return toeplitz_matvec(z, kernel.to(z.dtype), causal=False)


def ski_dense_matvec(x: torch.Tensor, interpolation: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """W A W^T x with W given densely, (n, r); A by its lags, (2r - 1, d)."""
    w = interpolation.to(x.dtype)
    return w @ _apply_small(kernel, w.t() @ x)


class _AdjointPair(torch.autograd.Function):
    """y = op(x) for a fixed linear map given with its adjoint, which is then the backward.

    W and W^T here are constants (no parameters), so neither side needs anything saved. Both are
    differentiable operations, so with create_graph=True the backward W^T g is recorded as a graph
    on g: exactly twice differentiable.
    """

    @staticmethod
    def forward(ctx, x, op, adjoint):
        ctx.adjoint = adjoint
        return op(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.adjoint(grad), None, None


def _interpolated_product(x: torch.Tensor, kernel: torch.Tensor, restrict, prolong) -> torch.Tensor:
    """W A W^T x from W^T (``restrict``) and W (``prolong``), each the other's backward. Compiled, the plain operations:
    the compiler derives their backward, and torch 2.11's routes a Function's gradient to the wrong output when its
    forward writes in place into what it returns (``_scatter``, ``_gather``; pytorch issue 180642)."""
    if torch.compiler.is_compiling():
        return prolong(_apply_small(kernel, restrict(x)))
    z = _AdjointPair.apply(x, restrict, prolong)
    return _AdjointPair.apply(_apply_small(kernel, z), prolong, restrict)


def _scatter(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, count: int) -> torch.Tensor:
    z = x.new_zeros(x.shape[0], count, x.shape[2])
    for a in range(index.shape[1]):
        z.index_add_(1, index[:, a], x * weight[:, a, None].to(x.dtype))
    return z


def _gather(z: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    y = z.index_select(1, index[:, 0]).mul_(weight[:, 0, None].to(z.dtype))
    for a in range(1, index.shape[1]):
        y.addcmul_(z.index_select(1, index[:, a]), weight[:, a, None].to(z.dtype))
    return y


def ski_sparse_matvec(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """W A W^T x with W given by its sparse rows (index, weight), each (n, s); A by its lags, (2r - 1, d).

    W^T is a scatter-add, z[:, index[i, a]] += weight[i, a] x[:, i], and W the matching gather.
    """
    count = (kernel.shape[0] + 1) // 2
    restrict = functools.partial(_scatter, index=index, weight=weight, count=count)
    prolong = functools.partial(_gather, index=index, weight=weight)
    return _interpolated_product(x, kernel, restrict, prolong)


def _linear_upsample(z: torch.Tensor, n: int) -> torch.Tensor:
    """W z for linear W: (batch, r, d) -> (batch, n, d), channels-last in and out."""
    return from_image(F.interpolate(as_image(z.contiguous()), size=(1, n), mode="bilinear", align_corners=True))


def _linear_downsample(x: torch.Tensor, count: int) -> torch.Tensor:
    """W^T x for linear W, the adjoint of linear upsampling: (batch, n, d) -> (batch, r, d)."""
    image = as_image(x.contiguous())
    size = [image.shape[0], image.shape[1], 1, count]
    return from_image(torch.ops.aten.upsample_bilinear2d_backward(image, [1, x.shape[1]], size, True))


def ski_linear_matvec(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """W A W^T x for linear interpolation, O(n d) by native upsampling kernels; A by its lags, (2r - 1, d).

    Both directions keep the channels-last layout in their backward too (PyTorch's own upsampling
    backward would first copy the gradient to channels-first).
    """
    n, count = x.shape[1], (kernel.shape[0] + 1) // 2
    restrict = functools.partial(_linear_downsample, count=count)
    prolong = functools.partial(_linear_upsample, n=n)
    return _interpolated_product(x, kernel, restrict, prolong)


def naive_ski_matrix(interpolation: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Explicit (d, n, n) W A W^T (tests and plots)."""
    w = interpolation.to(blocks.dtype)
    return w @ blocks @ w.t()


def dense_interpolation(n: int, rank: int, degree: int, device=None) -> torch.Tensor:
    """W as a dense (n, r) matrix."""
    index, weight = ski_weights(n, rank, degree, device)
    return interpolation_matrix(index, weight, inducing_spacing(n, rank)[0])


# -- the forms of ``ops/forms.py``: params kernel (2r - 1, d) by inducing lag, rank, degree -------------------


def _naive_ski(x: torch.Tensor, params: dict) -> torch.Tensor:
    interpolation = dense_interpolation(x.shape[1], params["rank"], params["degree"], x.device)
    return torch.einsum("dij,bjd->bid", naive_ski_matrix(interpolation, toeplitz_blocks(params["kernel"])), x)


def _sparse_ski(x: torch.Tensor, params: dict) -> torch.Tensor:
    index, weight = ski_weights(x.shape[1], params["rank"], params["degree"], x.device)
    return ski_sparse_matvec(x, index, weight.to(x.dtype), params["kernel"])


def _dense_ski(x: torch.Tensor, params: dict) -> torch.Tensor:
    return ski_dense_matvec(x, dense_interpolation(x.shape[1], params["rank"], params["degree"], x.device), params["kernel"])


def _ski_example(degree: int):
    def example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
        rank = 6
        count = inducing_spacing(n, rank)[0]
        kernel = torch.randn(2 * count - 1, dim, dtype=dtype, generator=generator)
        return torch.randn(batch, n, dim, dtype=dtype, generator=generator), {"kernel": kernel, "rank": rank, "degree": degree}, None

    return example


register_op("ski", OpForms(without_state(_naive_ski), without_state(_sparse_ski), None, _ski_example(3)))
register_op("ski_dense", OpForms(without_state(_naive_ski), without_state(_dense_ski), None, _ski_example(3)))
register_op(
    "ski_linear",
    OpForms(without_state(_naive_ski), without_state(lambda x, params: ski_linear_matvec(x, params["kernel"])), None, _ski_example(1)),
)
