"""Dilated depthwise convolution, the layer of a temporal convolutional network (TCNCA paper 004, §2).

Per channel y_i = sum_{k=0}^{K-1} f_k x_{i - (min_lag + k) * delta}, x zero outside [0, n):
K taps at lags min_lag, ..., min_lag + K - 1 in units of the dilation delta (causal: min_lag = 0;
centred: min_lag = -(K // 2)).

Writing i = a * delta + r turns it into an undilated convolution over a for each phase r:
y[a, r] = sum_k f_k x[a - min_lag - k, r]. So x is padded to a multiple of delta, viewed as
(batch * delta, n / delta, d) and handed to the banded product of ``band.py`` (oneDNN forward and
input gradient, blocked-matmul filter gradient): one fast kernel serves every dilation. Taps whose
lag reaches past both ends of the sequence multiply zeros only and are dropped first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .band import band_matvec


def _check_dilated(x: torch.Tensor, taps: torch.Tensor, dilation: int, min_lag: int) -> None:
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, length, channels), got shape {tuple(x.shape)}")
    if taps.dim() != 2 or taps.shape[0] != x.shape[2]:
        raise ValueError(f"taps must be (channels={x.shape[2]}, kernel_size), got shape {tuple(taps.shape)}")
    if isinstance(dilation, bool) or not isinstance(dilation, int) or dilation < 1:
        raise ValueError(f"dilation must be an integer >= 1, got {dilation!r}")
    if not -(taps.shape[1] - 1) <= min_lag <= 0:
        raise ValueError(f"min_lag must be in [-(kernel_size - 1), 0] so the taps cover lag 0, got {min_lag}")


def dilated_conv(x: torch.Tensor, taps: torch.Tensor, dilation: int, min_lag: int) -> torch.Tensor:
    """y_i = sum_k f_k x_{i - (min_lag + k) dilation}; x (batch, n, d), taps (d, K)."""
    _check_dilated(x, taps, dilation, min_lag)
    batch, n, d = x.shape
    rows = -(-n // dilation)
    first, last = max(min_lag, 1 - rows), min(min_lag + taps.shape[1] - 1, rows - 1)
    taps, min_lag = taps[:, first - min_lag : last - min_lag + 1], first  # lags reaching past the ends touch zeros only
    if dilation == 1:
        return band_matvec(x, taps, min_lag)
    phases = F.pad(x, (0, 0, 0, rows * dilation - n)).view(batch, rows, dilation, d)
    phases = phases.transpose(1, 2).reshape(batch * dilation, rows, d).contiguous()  # batch 1 would stay a strided view
    y = band_matvec(phases, taps, min_lag)
    return y.view(batch, dilation, rows, d).transpose(1, 2).reshape(batch, rows * dilation, d)[:, :n]


def naive_dilated_conv(x: torch.Tensor, taps: torch.Tensor, dilation: int, min_lag: int) -> torch.Tensor:
    """Reference: a Python loop over the taps, shifting x by each tap's lag (tests only)."""
    n = x.shape[1]
    y = torch.zeros_like(x)
    for k in range(taps.shape[1]):
        shift = (min_lag + k) * dilation  # y_i += f_k x_{i - shift}
        if abs(shift) >= n:
            continue
        if shift >= 0:
            y[:, shift:] = y[:, shift:] + taps[:, k] * x[:, : n - shift]
        else:
            y[:, :shift] = y[:, :shift] + taps[:, k] * x[:, -shift:]
    return y
