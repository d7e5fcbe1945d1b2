"""Fourier token mixing: FNet and FNetAR (FNetAR, Lou et al. 2021, §II.3-II.4).

FNet: y = Re(FFT_seq(FFT_hidden(x))), or Re(FFT_seq(x)) for the sequence-only variant.

FNetAR (our reading of Eq. 7, "pad the Fourier matrix with zeros and roll the rows"; the
equation itself did not survive extraction): with window W, the token at stream position t
uses frequency i = t mod W and mixes the W inputs ending at t, oldest first, with the real part
of the W-point DFT row i:

    y_t = sum_{m=0}^{W-1} cos(2 pi i m / W) x_{t-W+1+m},     x_s = 0 before the stream starts.

Position i = 0 of each window-segment is the plain sum of its window. Grouping the stream into
segments of W positions, segment s is one fixed (W, 2W - 1) matrix (row i holds the DFT row
shifted right by i: the zero-padded, row-rolled Fourier matrix) applied to the 2W - 1 inputs
[previous W - 1; segment]. Exactly causal, parameter free, O(n W d).
"""

from __future__ import annotations

import functools
import math

import torch

from .fft import spectral_dtype
from .forms import OpForms, register_op, returned, token_by_token, without_state


def fnet_mixing(x: torch.Tensor, sequence_only: bool = False) -> torch.Tensor:
    """Re(FFT) over the sequence (dim 1) and, unless ``sequence_only``, the hidden dim (last)."""
    work = x.to(spectral_dtype(x.dtype))
    mixed = torch.fft.fft(work, dim=1) if sequence_only else torch.fft.fft2(work, dim=(1, 2))
    return mixed.real.to(x.dtype)


def _rolled_fourier_matrix(window: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(W, 2W - 1): row i = [0]*i + cos(2 pi i m / W) for m < W + [0]*(W - 1 - i), made on ``device``: each angle
    reduced exactly first (i m mod W, in integers), its cosine in float64 (float32 on MPS, which has no float64),
    then cast to ``dtype``."""
    exact = torch.float32 if device.type == "mps" else torch.float64
    rows = torch.arange(window, device=device)[:, None]
    offset = torch.arange(2 * window - 1, device=device)[None, :] - rows  # m = column - i
    inside = (offset >= 0) & (offset < window)
    angle = (rows * offset).remainder(window).to(exact) * (2 * math.pi / window)
    return torch.where(inside, torch.cos(angle), 0.0).to(dtype)


# Kept for the process, never dropped: a CUDA graph captured on a static step reads the matrix it was captured with.
_kept_fourier_matrices = functools.cache(_rolled_fourier_matrix)


def fourier_ar_matrix(window: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """The fixed (W, 2W - 1) causal Fourier mixing matrix of one window-segment, made on the device it is used on (a
    copy from the host would make a GPU wait for every kernel queued before it, and could not be captured in a CUDA
    graph) and kept per window, dtype and device; inside ``torch.compile``, part of the traced graph."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    device = torch.device("cpu" if device is None else device)
    if torch.compiler.is_compiling():
        return _rolled_fourier_matrix(window, dtype, device)
    with torch.inference_mode(False):  # a kept matrix made under inference mode could not be saved for a later backward
        return _kept_fourier_matrices(window, dtype, device)


def fourier_ar_mix(x: torch.Tensor, window: int, history: torch.Tensor | None = None, start: int = 0) -> torch.Tensor:
    """FNetAR mixing of x (batch, n, d) whose first token sits at stream position ``start``.

    ``history`` (batch, h, d) holds the inputs just before x (the newest last); missing ones are
    zeros (the stream start). Chunking a stream arbitrarily, with the last W - 1 inputs passed on
    as ``history`` and the running ``start``, gives exactly the whole-stream result.
    """
    batch, n, dim = x.shape
    work = spectral_dtype(x.dtype)
    phase = start % window  # position of x[0] inside its window-segment
    past = torch.zeros(batch, window - 1 + phase, dim, dtype=work, device=x.device)
    if history is not None and history.shape[1]:
        kept = history[:, -past.shape[1] :].to(work)
        past[:, past.shape[1] - kept.shape[1] :] = kept
    segments = -(-(phase + n) // window)
    stream = torch.cat([past, x.to(work)], dim=1)
    stream = torch.nn.functional.pad(stream, (0, 0, 0, segments * window + window - 1 - stream.shape[1]))
    windows = stream.unfold(1, 2 * window - 1, window)  # (batch, segments, dim, 2W - 1)
    mixed = torch.einsum("bsdk,ik->bsid", windows, fourier_ar_matrix(window, work, x.device))
    return mixed.reshape(batch, segments * window, dim)[:, phase : phase + n].to(x.dtype)


def naive_fourier_ar_mix(x: torch.Tensor, window: int) -> torch.Tensor:
    """Reference: the defining sum, one output at a time, for a stream starting at x[0] (tests only)."""
    out = torch.zeros_like(x)
    for t in range(x.shape[1]):
        frequency = t % window
        for m in range(window):
            source = t - window + 1 + m
            if source >= 0:
                out[:, t] += math.cos(2 * math.pi * frequency * m / window) * x[:, source]
    return out


# -- the forms of ``ops/forms.py``: params window W; the state: the last W - 1 inputs and the position --------


def _start(x: torch.Tensor, window: int, state) -> tuple[torch.Tensor, int]:
    return (x.new_zeros(x.shape[0], window - 1, x.shape[2]), 0) if state is None else state


def _after(history: torch.Tensor, x: torch.Tensor, start: int, window: int) -> tuple[torch.Tensor, int]:
    full = torch.cat([history, x], dim=1)
    return full[:, full.shape[1] - (window - 1) :], start + x.shape[1]


def naive_fourier_ar_form(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    """The defining sum over the stream rebuilt from the state: zeros where no window of x reaches, then the history."""
    window = params["window"]
    history, start = _start(x, window, initial_state)
    known = history[:, max(0, window - 1 - start) :]
    lead = x.new_zeros(x.shape[0], start - known.shape[1], x.shape[2])
    y = naive_fourier_ar_mix(torch.cat([lead, known, x], dim=1), window)[:, start:]
    return returned(y, _after(history, x, start, window), output_final_state)


def parallel_fourier_ar(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    window = params["window"]
    history, start = _start(x, window, initial_state)
    return returned(fourier_ar_mix(x, window, history, start), _after(history, x, start, window), output_final_state)


def recurrent_fourier_ar(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    def step(token, state):
        return parallel_fourier_ar(token, params, state, True)

    return returned(*token_by_token(step, x, _start(x, params["window"], initial_state)), output_final_state)


def _fourier_ar_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    window = 5
    x, history = (torch.randn(batch, length, dim, dtype=dtype, generator=generator) for length in (n, window - 1))
    return x, {"window": window}, (history, 13)


def naive_fnet_mixing(x: torch.Tensor, sequence_only: bool = False) -> torch.Tensor:
    """Reference: Re(F_n X F_d^T) with explicit DFT matrices, Re(F) = cos, Im(F) = -sin (tests only)."""

    def dft(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = 2 * math.pi * torch.outer(torch.arange(size), torch.arange(size)).to(x.dtype) / size
        return torch.cos(angles), torch.sin(angles)

    (c_n, s_n), (c_d, s_d) = dft(x.shape[1]), dft(x.shape[2])
    if sequence_only:
        return torch.einsum("ij,bjd->bid", c_n, x)
    return torch.einsum("ij,bjk,dk->bid", c_n, x, c_d) - torch.einsum("ij,bjk,dk->bid", s_n, x, s_d)


def _fnet_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    return torch.randn(batch, n, dim, dtype=dtype, generator=generator), {}, None


register_op("fourier_ar", OpForms(naive_fourier_ar_form, parallel_fourier_ar, recurrent_fourier_ar, _fourier_ar_example))
register_op(
    "fnet",
    OpForms(without_state(lambda x, params: naive_fnet_mixing(x)), without_state(lambda x, params: fnet_mixing(x)), None, _fnet_example),
)
