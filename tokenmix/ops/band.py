"""Banded Toeplitz product: a depthwise 1-D convolution (SKI-TNN paper 000, §3.2, the sparse part).

Per channel y_i = sum_{l = l0}^{l0 + m - 1} f_l x_{i - l} with x zero outside [0, n): a Toeplitz
matrix with m non-zero diagonals, lags l0 ... l0 + m - 1 (centred: l0 = -(m - 1)/2; causal: l0 = 0).

Forward and input gradient run as oneDNN depthwise convolutions on the (batch, length, channels)
layout as is (channels-last); the filter gradient, which PyTorch computes slowly for depthwise
convolutions on CPU, is a batched matmul over length blocks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_FILTER_GRAD_BLOCK = 64  # length block of the filter gradient (measured best on 2 CPU cores)


def _check_band(x: torch.Tensor, taps: torch.Tensor, min_lag: int) -> None:
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, length, channels), got shape {tuple(x.shape)}")
    if taps.dim() != 2 or taps.shape[0] != x.shape[2]:
        raise ValueError(f"taps must be (channels={x.shape[2]}, filter_size), got shape {tuple(taps.shape)}")
    if not -(taps.shape[1] - 1) <= min_lag <= 0:
        raise ValueError(f"min_lag must be in [-(filter_size - 1), 0] so the band covers lag 0, got {min_lag}")


def as_image(x: torch.Tensor) -> torch.Tensor:
    """(batch, length, d) -> (batch, d, 1, length): a channels-last view of the same memory, the
    layout oneDNN's depthwise convolutions and PyTorch's upsampling kernels run on without copies."""
    return x.transpose(1, 2)[:, :, None, :]


def from_image(image: torch.Tensor) -> torch.Tensor:
    """The inverse view of ``as_image``."""
    return image[:, :, 0, :].transpose(1, 2)


def _band_forward(x: torch.Tensor, taps: torch.Tensor, min_lag: int) -> torch.Tensor:
    """The convolution itself (no autograd of its own): (batch, n, d) -> (batch, n, d)."""
    n, m = x.shape[1], taps.shape[1]
    left, right = min_lag + m - 1, -min_lag  # conv2d correlates: out_i = sum_k w_k x_{i + k - left}
    pad = max(left, right)
    weight = taps.flip(1)[:, None, None, :].to(x.dtype)
    out = F.conv2d(as_image(x), weight, padding=(0, pad), groups=x.shape[2])
    return from_image(out[..., pad - left : pad - left + n])


def _filter_gradient(x: torch.Tensor, grad_y: torch.Tensor, min_lag: int, m: int) -> torch.Tensor:
    """dL/df_l = sum_{b, i} g_i x_{i - l}, as (d, m), by length blocks of B per channel.

    With x padded and cut into blocks X_j, the window of block j is [X_j, head of X_{j+1}], so
    G_j^T [X_j, X_{j+1}[:m-1]] holds every product g_t x_s of the block; lag l lies on a diagonal.
    Two batched matmuls over channel-major copies of g and x (no overlapping-window copy).
    """
    batch, n, d = x.shape
    block = max(min(_FILTER_GRAD_BLOCK, n), m - 1)  # short rows (dilation phases) get short blocks
    blocks = -(-n // block)
    max_lag = min_lag + m - 1
    grad = F.pad(grad_y, (0, 0, 0, blocks * block - n)).view(batch, blocks, block, d)
    grad = grad.permute(3, 0, 1, 2).reshape(d, batch * blocks, block).contiguous().transpose(1, 2)  # (d, B, blocks)
    padded = F.pad(x, (0, 0, max_lag, (blocks + 1) * block - n - max_lag))  # x_{i - l} for every l, one spare block
    padded = padded.permute(2, 0, 1).contiguous().view(d, batch, blocks + 1, block)
    own = padded[:, :, :blocks].reshape(d, batch * blocks, block)
    head = padded[:, :, 1:, : m - 1].reshape(d, batch * blocks, m - 1)
    products = torch.cat([torch.bmm(grad, own), torch.bmm(grad, head)], dim=2)  # (d, B, B + m - 1)
    # products[c, t, s] pairs g at block offset t with padded x at offset s; lag l sits at s = t + max_lag - l
    diagonals = products.as_strided((d, block, m), (products.stride(0), products.stride(1) + 1, 1)).sum(1)
    return diagonals.flip(1)


class _BandConvolution(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, taps, min_lag):
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, taps)
        ctx.min_lag = min_lag
        return _band_forward(x, taps, min_lag)

    @staticmethod
    def backward(ctx, grad_y):
        grad_y = grad_y.contiguous()  # autograd may hand in a strided view, which oneDNN would reorder slowly
        x, taps = ctx.saved_tensors
        m, min_lag = taps.shape[1], ctx.min_lag
        grad_x = grad_taps = None
        if ctx.needs_input_grad[0]:  # the transpose: reversed taps over negated lags
            grad_x = _band_forward(grad_y, taps.flip(1), -(min_lag + m - 1))
        if ctx.needs_input_grad[1]:
            grad_taps = _filter_gradient(x, grad_y, min_lag, m).to(taps.dtype)
        return grad_x, grad_taps, None


def band_matvec(x: torch.Tensor, taps: torch.Tensor, min_lag: int) -> torch.Tensor:
    """y_i = sum_l f_l x_{i - l} per channel; taps (d, m) for lags min_lag ... min_lag + m - 1."""
    _check_band(x, taps, min_lag)
    return _BandConvolution.apply(x, taps, min_lag)


def naive_band_matrix(taps: torch.Tensor, n: int, min_lag: int) -> torch.Tensor:
    """Explicit (d, n, n) banded Toeplitz matrices, T_ij = f_{i - j} (tests only)."""
    lags = torch.arange(n)[:, None] - torch.arange(n)[None, :] - min_lag
    inside = (lags >= 0) & (lags < taps.shape[1])
    return taps[:, lags.clamp(0, taps.shape[1] - 1)] * inside.to(taps.dtype)


def naive_band_matvec(x: torch.Tensor, taps: torch.Tensor, min_lag: int) -> torch.Tensor:
    return torch.einsum("dij,bjd->bid", naive_band_matrix(taps, x.shape[1], min_lag), x)
