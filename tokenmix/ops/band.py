"""Banded Toeplitz product: a depthwise 1-D convolution, optionally dilated (SKI-TNN, Moreno et al. 2023,
§3.2, the sparse part; TCNCA, Terzić et al. 2023, §2, the TCN's layers).

Per channel y_i = sum_{k=0}^{m-1} f_k x_{i - (l0 + k) delta} with x zero outside [0, n): a Toeplitz
matrix with m non-zero diagonals at lags (l0 + k) delta (centred: l0 = -(m - 1)/2; causal: l0 = 0;
delta the dilation, 1 for a plain band).

With x padded to R delta tokens, the (batch, length, channels) tensor is, as it lies in memory,
the channels-last image (batch, channels, R, delta): token i = a delta + r sits at row a, column
r, and the dilated convolution is an undilated one down the rows, y[a, r] = sum_k f_k x[a - l0 - k, r].
Forward and input gradient run as oneDNN depthwise convolutions on that view, without copies;
the filter gradient, which PyTorch computes slowly for depthwise convolutions on CPU, is a batched
matmul over row blocks of channel-major copies. Inside ``torch.compile`` the convolution keeps its own
backward, which the compiler derives and fuses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..precision import without_autocast
from ..validation import check_int

_FILTER_GRAD_BLOCK = 32  # row block of the filter gradient (measured best on 2 CPU cores)
_TRANSPOSE_CHUNK = 2**18  # elements per chunk of the channel-major copy (fits in L2)


def _check_band(x: torch.Tensor, taps: torch.Tensor, min_lag: int, dilation: int) -> None:
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, length, channels), got shape {tuple(x.shape)}")
    if taps.dim() != 2 or taps.shape[0] != x.shape[2]:
        raise ValueError(f"taps must be (channels={x.shape[2]}, filter_size), got shape {tuple(taps.shape)}")
    if not -(taps.shape[1] - 1) <= min_lag <= 0:
        raise ValueError(f"min_lag must be in [-(filter_size - 1), 0] so the band covers lag 0, got {min_lag}")
    check_int(dilation, "dilation")


def as_image(x: torch.Tensor) -> torch.Tensor:
    """(batch, length, d) -> (batch, d, 1, length): a channels-last view of the same memory, the
    layout oneDNN's depthwise convolutions and PyTorch's upsampling kernels run on without copies."""
    return x.transpose(1, 2)[:, :, None, :]


def from_image(image: torch.Tensor) -> torch.Tensor:
    """The inverse view of ``as_image``."""
    return image[:, :, 0, :].transpose(1, 2)


def _phase_image(x: torch.Tensor, dilation: int) -> torch.Tensor:
    """(batch, n, d) -> the channels-last view (batch, d, R, dilation), x zero-padded to R * dilation tokens."""
    batch, n, d = x.shape
    rows = -(-n // dilation)
    if torch.compiler.is_compiling() or rows * dilation != n:  # compiled: no branch on the length's remainder
        x = F.pad(x, (0, 0, 0, rows * dilation - n))
    return x.contiguous().view(batch, rows, dilation, d).permute(0, 3, 1, 2)


def _band_forward(x: torch.Tensor, taps: torch.Tensor, min_lag: int, dilation: int) -> torch.Tensor:
    """The convolution itself (no autograd of its own): (batch, n, d) -> (batch, n, d)."""
    batch, n, d = x.shape
    m = taps.shape[1]
    image = _phase_image(x, dilation)
    rows = image.shape[2]
    above, below = min_lag + m - 1, -min_lag  # conv2d correlates: out_a = sum_k w_k x_{a + k - above}
    pad = max(above, below)
    weight = taps.flip(1)[:, None, :, None].to(x.dtype)
    out = F.conv2d(image, weight, padding=(pad, 0), groups=d)[:, :, pad - above : pad - above + rows]
    return out.permute(0, 2, 3, 1).reshape(batch, rows * dilation, d)[:, :n]


def _channel_major(image: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """(batch, d, R, delta) image -> contiguous (d, batch * delta, before + R + after): rows per phase, zero-padded.

    The transposing copy runs in row chunks of about 2^18 elements: PyTorch's one-shot strided copy
    of the whole tensor was several times slower (docs/ski_fd.md, "The band, fast on CPU").
    """
    batch, d, rows, dilation = image.shape
    major = image.new_empty(d, batch, dilation, before + rows + after)
    major[..., :before].zero_()
    major[..., before + rows :].zero_()
    source = image.permute(1, 0, 3, 2)
    chunk = max(1, _TRANSPOSE_CHUNK // (batch * d * dilation))
    for start in range(0, rows, chunk):
        stop = min(start + chunk, rows)
        major[..., before + start : before + stop].copy_(source[..., start:stop])
    return major.view(d, batch * dilation, before + rows + after)


def _filter_gradient(x: torch.Tensor, grad_y: torch.Tensor, min_lag: int, m: int, dilation: int) -> torch.Tensor:
    """dL/df_k = sum_{b, a, r} g[a, r] x[a - l0 - k, r], as (d, m), by row blocks of B per phase.

    With x padded and cut into blocks X_j, the window of block j is [X_j, head of X_{j+1}], so
    G_j^T [X_j, X_{j+1}[:m-1]] holds every product g_t x_s of the block; a lag lies on a diagonal.
    Two batched matmuls over channel-major copies of g and x (no overlapping-window copy).
    """
    x_image, g_image = _phase_image(x, dilation), _phase_image(grad_y, dilation)
    d, rows = x_image.shape[1], x_image.shape[2]
    block = max(min(_FILTER_GRAD_BLOCK, rows), m - 1)  # short phases get short blocks
    blocks = -(-rows // block)
    max_lag = min_lag + m - 1
    grad = _channel_major(g_image, 0, blocks * block - rows).view(d, -1, block).transpose(1, 2)  # (d, B, sequences * blocks)
    padded = _channel_major(x_image, max_lag, (blocks + 1) * block - rows - max_lag)  # x_{a - lag}, one spare block
    sequences = padded.shape[1] * blocks
    padded = padded.view(d, -1, blocks + 1, block)
    own = padded[:, :, :blocks].reshape(d, sequences, block)
    head = padded[:, :, 1:, : m - 1].reshape(d, sequences, m - 1)
    products = torch.cat([torch.bmm(grad, own), torch.bmm(grad, head)], dim=2)  # (d, B, B + m - 1)
    # products[c, t, s] pairs g at block offset t with padded x at offset s; lag l sits at s = t + max_lag - l
    diagonals = products.as_strided((d, block, m), (products.stride(0), products.stride(1) + 1, 1)).sum(1)
    return diagonals.flip(1)


class _BandConvolution(torch.autograd.Function):
    """y = band_matvec(x, f); dL/dx is the same convolution with reversed taps over negated lags and
    dL/df_l = sum_i g_i x_{i - l} (``_filter_gradient``). Both are plain differentiable operations on
    x, f and dL/dy, so with create_graph=True autograd records them: exactly twice differentiable."""

    @staticmethod
    @without_autocast
    def forward(ctx, x, taps, min_lag, dilation):
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, taps)
        ctx.min_lag, ctx.dilation = min_lag, dilation
        return _band_forward(x, taps, min_lag, dilation)

    @staticmethod
    @without_autocast
    def backward(ctx, grad_y):
        x, taps = ctx.saved_tensors
        m, min_lag, dilation = taps.shape[1], ctx.min_lag, ctx.dilation
        grad_x = grad_taps = None
        if ctx.needs_input_grad[0]:  # the transpose: reversed taps over negated lags
            grad_x = _band_forward(grad_y, taps.flip(1), -(min_lag + m - 1), dilation)
        if ctx.needs_input_grad[1]:
            grad_taps = _filter_gradient(x, grad_y, min_lag, m, dilation).to(taps.dtype)
        return grad_x, grad_taps, None, None


def band_matvec(x: torch.Tensor, taps: torch.Tensor, min_lag: int, dilation: int = 1) -> torch.Tensor:
    """y_i = sum_k f_k x_{i - (min_lag + k) dilation} per channel; taps (d, m), lags min_lag ... min_lag + m - 1."""
    _check_band(x, taps, min_lag, dilation)
    if torch.compiler.is_compiling():  # the convolution's own backward: the compiler derives and fuses it
        return _band_forward(x, taps, min_lag, dilation)
    return _BandConvolution.apply(x, taps, min_lag, dilation)


def naive_band_matrix(taps: torch.Tensor, n: int, min_lag: int) -> torch.Tensor:
    """Explicit (d, n, n) banded Toeplitz matrices, T_ij = f_{i - j} (tests only)."""
    lags = torch.arange(n)[:, None] - torch.arange(n)[None, :] - min_lag
    inside = (lags >= 0) & (lags < taps.shape[1])
    return taps[:, lags.clamp(0, taps.shape[1] - 1)] * inside.to(taps.dtype)


def naive_band_matvec(x: torch.Tensor, taps: torch.Tensor, min_lag: int) -> torch.Tensor:
    return torch.einsum("dij,bjd->bid", naive_band_matrix(taps, x.shape[1], min_lag), x)
