"""Causal frequency responses by the discrete Hilbert transform (SKI-TNN, Moreno et al. 2023, §3.3.1, Alg. 2).

Given a real, even response R at the rfft frequencies w_m = 2 pi m / N (m = 0 ... N/2), the
causal kernel with Re(G) = R is built in the time domain: e = irfft(R, N) is real and even; g keeps
e[0], doubles e[1 ... N/2 - 1], keeps e[N/2] once and zeroes lags N/2 + 1 ... N - 1. Then
G = rfft(g) = R - i H{R}: its real part is R exactly (the N/2 sample is kept once, where the
authors' released code doubles it) and its impulse response g vanishes at negative lags.
"""

from __future__ import annotations

import math

import torch

from .fft import fast_fft_size
from .forms import OpForms, register_op, without_state
from .toeplitz import naive_toeplitz_matvec, spectral_matvec


def causal_window(fft_size: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """[1, 2, ..., 2, 1, 0, ..., 0]: 1 at lags 0 and N/2, 2 between, 0 at the negative lags."""
    if fft_size < 2 or fft_size % 2:
        raise ValueError(f"fft_size must be an even integer >= 2, got {fft_size}")
    window = torch.zeros(fft_size, dtype=dtype, device=device)
    window[1 : fft_size // 2] = 2.0
    window[0] = window[fft_size // 2] = 1.0
    return window


def causal_impulse_response(response: torch.Tensor, fft_size: int) -> torch.Tensor:
    """g = window * irfft(R, N) along the last dimension: the causal kernel's taps at lags 0 ... N - 1."""
    if response.shape[-1] != fft_size // 2 + 1:
        raise ValueError(f"response must have N/2 + 1 = {fft_size // 2 + 1} frequencies, got {response.shape[-1]}")
    even = torch.fft.irfft(response, n=fft_size, dim=-1)
    return even * causal_window(fft_size, even.dtype, even.device)


def causal_spectrum(response: torch.Tensor, fft_size: int) -> torch.Tensor:
    """G = R - i H{R} at the rfft frequencies, (..., N/2 + 1) complex, for a real response (..., N/2 + 1)."""
    return torch.fft.rfft(causal_impulse_response(response, fft_size), dim=-1)


def naive_causal_spectrum(response: torch.Tensor, fft_size: int) -> torch.Tensor:
    """Reference by Definition 1: G = R - i (R * h) on the full N-point grid, h[l] = 2/(pi l) for odd l.

    The discrete Hilbert transform of a length-N periodic sequence is a circular convolution with
    the periodised kernel h_N[l] = (2/N) cot(pi l / N) at odd l (0 at even l); this is what Definition
    1's h becomes on a finite grid (tests only; explicit N x N matrix).
    """
    n = fft_size
    full = torch.cat([response, response[..., 1:-1].flip(-1)], dim=-1)  # R(w) even on m = 0 ... N-1
    lags = torch.arange(n, dtype=torch.float64)
    odd = lags.long() % 2 == 1
    kernel = torch.zeros(n, dtype=torch.float64)
    kernel[odd] = (2.0 / n) / torch.tan(math.pi * lags[odd] / n)
    circulant = kernel[(torch.arange(n)[:, None] - torch.arange(n)[None, :]) % n]
    transform = full.to(torch.float64) @ circulant.t()
    return torch.complex(full.to(torch.float64), -transform)[..., : n // 2 + 1]


# -- the forms of ``ops/forms.py``: FD-TNO's causal product, params the real response (d, N/2 + 1), N = fast_fft_size(2n)


def _naive_causal_fd(x: torch.Tensor, params: dict) -> torch.Tensor:
    """The causal taps from Definition 1's spectrum, then the explicit lower-triangular Toeplitz matrix."""
    n, fft_size = x.shape[1], fast_fft_size(2 * x.shape[1])
    taps = torch.fft.irfft(naive_causal_spectrum(params["response"], fft_size), n=fft_size, dim=-1)[:, :n]
    return naive_toeplitz_matvec(x, taps.t().to(x.dtype), True)


def _causal_fd(x: torch.Tensor, params: dict) -> torch.Tensor:
    fft_size = fast_fft_size(2 * x.shape[1])
    return spectral_matvec(x, causal_spectrum(params["response"], fft_size), fft_size)


def _response_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    frequencies = fast_fft_size(2 * n) // 2 + 1
    response = torch.randn(dim, frequencies, dtype=dtype, generator=generator)
    return torch.randn(batch, n, dim, dtype=dtype, generator=generator), {"response": response}, None


register_op("causal_fd_toeplitz", OpForms(without_state(_naive_causal_fd), without_state(_causal_fd), None, _response_example))
