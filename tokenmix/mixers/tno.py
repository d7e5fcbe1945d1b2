"""Toeplitz neural operator, TNO (TNN, Qin et al. 2023, §3.2-3.4).

Per channel y = T x with T_ij = t_{i-j} and t_k = lambda^|k| RPE(k): the RPE MLP of the raw lag
and an exponential decay bias (lambda = 0.99 fixed by default; 1.0 turns it off; Table 10).
Applied by FFT at a fast size N >= 2n, in O(n log n).

The kernel spectrum is factored through the RPE's output layer (W, b):
rfft(lambda^|k| (H_k W + b)) = rfft([lambda^|k| H_k, lambda^|k|]) @ [W; b], so only rpe_dim + 1
columns are transformed and the gradient of W is a matmul, not a d-channel FFT.
``factored=False`` runs the paper's own algorithm instead (the RPE at every lag for all d channels,
then a d-channel kernel FFT): the same operator, kept as the baseline that FD-TNO's speed claims
(Moreno et al. 2023) are made against.
Without autograd the spectrum is cached until the weights or the length change (``mixers.cache``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..fields import Flag, Number, setting
from ..ops.fft import convolution_fft_size
from ..ops.toeplitz import (
    complex_readout,
    factored_spectral_matvec,
    fused_factored_spectral_matvec,
    fused_wanted,
    spectral_matvec,
    toeplitz_spectrum,
)
from ..options import Options
from .base import PADDING_SIDES, ChannelSliced, Mixer, ToeplitzOperator
from .cache import Cache
from .registry import register_mixer
from .rpe import RelativePositionEncoder, RpeOptions
from .toeplitz_stream import ToeplitzStreaming


def relative_lags(n: int, causal: bool, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Lags 0..n-1 (causal) or -(n-1)..n-1 (bidirectional), as float: float64 for a float64 module (its
    decay then the same on every device), else float32 (exact lags below 2^24, also for half modules)."""
    start = 0 if causal else -(n - 1)
    return torch.arange(start, n, device=device, dtype=torch.promote_types(dtype, torch.float32))


class ExponentialDecay(nn.Module):
    """lambda^|k|; fixed, or learnable as lambda = decay + (1 - decay) * sigmoid(p)."""

    def __init__(self, decay: float = 0.99, learnable: bool = False):
        super().__init__()
        if not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be a number in (0, 1], got {decay!r}")
        if learnable and decay == 1.0:
            raise ValueError("learnable_decay=True needs decay < 1 (it is the lower bound of lambda)")
        self.floor = float(decay)
        self.logit = nn.Parameter(torch.zeros(())) if learnable else None

    def rate(self) -> torch.Tensor | float:
        """lambda: a number when fixed (a tensor made on the host would be copied to the lags' device at every call; on a
        GPU, a copy that waits for every kernel queued before it)."""
        if self.logit is None:
            return self.floor
        return self.floor + (1.0 - self.floor) * torch.sigmoid(self.logit)

    def forward(self, lags: torch.Tensor) -> torch.Tensor:
        if self.logit is None:
            return torch.exp(lags.abs() * math.log(self.floor))
        return torch.exp(lags.abs() * torch.log(self.rate().to(lags.dtype)))

    def extra_repr(self) -> str:
        return f"decay={self.floor}, learnable={self.logit is not None}"


def cached_or_factored_matvec(
    cache: Cache, module: nn.Module, x: torch.Tensor, key, fft_size: int, factors, channels: slice = slice(None)
) -> torch.Tensor:
    """T x for the spectrum readout^T @ basis of ``channels`` (readout's columns), ``factors() -> (basis,
    readout)``: under autograd the factored product (no gradient of the (d, F) spectrum is formed; on CUDA, where
    triton imports, its Triton kernels, which form no spectrum at all: ``ops.fused_toeplitz``); otherwise the
    spectrum of those channels, cached under ``key`` and the channels."""
    if torch.is_grad_enabled():
        cache.clear()
        basis, readout = factors()
        matvec = fused_factored_spectral_matvec if fused_wanted(x) else factored_spectral_matvec
        return matvec(x, basis, readout[:, channels], fft_size)
    key = (key, channels.start, channels.stop)
    return spectral_matvec(x, cache.get(key, lambda: complex_readout(*factors())[channels], weights=module), fft_size)


@dataclass
class DecayOptions(Options):
    decay: float = setting(0.99, Number(0, 1, open_minimum=True), "exponential decay bias lambda^|k| on the kernel; 1.0 turns it off")
    learnable_decay: bool = setting(False, Flag(), "learn lambda = decay + (1 - decay) sigmoid(p) instead")


@dataclass
class TnoOptions(DecayOptions, RpeOptions):
    factored: bool = setting(
        True, Flag(), "transform rpe_dim + 1 feature columns, not the d-channel kernel; false runs the paper's own algorithm (slower)"
    )


@register_mixer("tno")
class Tno(ToeplitzStreaming, ToeplitzOperator, ChannelSliced, Mixer):
    """Toeplitz neural operator mixer (name ``tno``)."""

    options_type = TnoOptions

    fft_based = True  # benchmarks compare it with a bare rfft + irfft round trip
    inner_precision = "float32"  # FFT products; the RPE reads lags up to n - 1
    padding_invariant_sides = PADDING_SIDES  # t_k depends on the lag k only

    def __init__(self, dim: int, causal: bool = False, options: TnoOptions | None = None):
        super().__init__(dim, causal, options)
        o = self.options
        self.factored = o.factored
        self.rpe = RelativePositionEncoder(dim, o.rpe_dim, o.rpe_layers, o.activation)
        self.decay = ExponentialDecay(o.decay, o.learnable_decay)
        self._cache = Cache()

    def kernel(self, n: int, channels: slice = slice(None)) -> torch.Tensor:
        """Explicit t_k by lag: (n, channels) causal or (2n - 1, channels) bidirectional."""
        output = self.rpe.output
        lags = relative_lags(n, self.causal, output.weight.device, output.weight.dtype)
        return self.decay(lags)[:, None] * F.linear(self.rpe.features(lags), output.weight[channels], output.bias[channels])

    def spectrum_factors(self, n: int, fft_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(basis spectrum (e + 1, N/2 + 1), readout (e + 1, dim)): the spectrum is readout^T @ basis."""
        lags = relative_lags(n, self.causal, self.rpe.output.weight.device, self.rpe.output.weight.dtype)
        decay = self.decay(lags)[:, None]
        basis = torch.cat([decay * self.rpe.features(lags), decay], dim=1)
        readout = torch.cat([self.rpe.output.weight.t(), self.rpe.output.bias[None]], dim=0)
        return toeplitz_spectrum(basis, n, self.causal, fft_size), readout

    def spectrum(self, n: int, fft_size: int) -> torch.Tensor:
        """rfft of the circulant embedding of the kernel, (dim, N/2 + 1), factored unless told otherwise."""
        if not self.factored:
            return self.unfactored_spectrum(n, fft_size)
        return complex_readout(*self.spectrum_factors(n, fft_size))

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice) -> torch.Tensor:
        n = x.shape[1]
        fft_size = convolution_fft_size(2 * n)
        if self.factored:
            return cached_or_factored_matvec(self._cache, self, x, n, fft_size, lambda: self.spectrum_factors(n, fft_size), channels)
        key = (n, channels.start, channels.stop)
        return spectral_matvec(x, self._cache.get(key, lambda: self.unfactored_spectrum(n, fft_size, channels), weights=self), fft_size)

    def unfactored_spectrum(self, n: int, fft_size: int, channels: slice = slice(None)) -> torch.Tensor:
        """The paper's algorithm: the kernel at every lag for these channels, then its FFT."""
        return toeplitz_spectrum(self.kernel(n, channels), n, self.causal, fft_size)
