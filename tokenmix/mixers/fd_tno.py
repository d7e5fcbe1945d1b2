"""FD-TNO: a Toeplitz operator learned in the frequency domain (SKI-TNN, Moreno et al. 2023, §3.3, Alg. 2).

The RPE MLP (TNN's structure: ``rpe_dim``, ``rpe_layers``, ``activation``) takes the frequency
w_m = 2 pi m / N, m = 0 ... N/2, of the FFT size N >= 2n, so a longer sequence evaluates it on a
finer grid of the same [0, pi]. No decay bias: the smoothness of the response sets how fast the
kernel decays in time (GeLU faster than any exponential, SiLU than any polynomial; §4.2).
- causal: the RPE gives a real response R; G = R - i H{R} by the discrete Hilbert transform
  (ops/hilbert.py), whose impulse response is exactly causal and Re(G) = R;
- bidirectional: the RPE gives Re and Im of G (2 values per channel), Im forced to 0 at w = 0
  and w = pi; no kernel FFT at all.
y = irfft(G * rfft(x, N), N)[:n]. Both responses are linear in the RPE's output layer, so, as in
TNO, the spectrum is a (few-column) basis times the output weights: a single matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..fields import Choice, setting
from ..ops.activations import ACTIVATIONS
from ..ops.fft import fast_fft_size, spectral_dtype
from ..ops.hilbert import causal_impulse_response, causal_spectrum
from ..ops.toeplitz import complex_readout, spectral_matvec
from .base import ChannelSliced, Mixer, ToeplitzOperator
from .cache import Cache
from .registry import register_mixer
from .rpe import RelativePositionEncoder, RpeOptions
from .tno import cached_or_factored_matvec
from .toeplitz_stream import ToeplitzStreaming


def rfft_frequencies(fft_size: int, device=None) -> torch.Tensor:
    """w_m = 2 pi m / N for m = 0 ... N/2."""
    return torch.arange(fft_size // 2 + 1, device=device, dtype=torch.float32) * (2 * math.pi / fft_size)


@dataclass
class FdTnoOptions(RpeOptions):
    activation: str = setting("gelu", Choice(sorted(ACTIVATIONS)), "RPE activation")


@register_mixer("fd_tno")
class FdTno(ToeplitzStreaming, ToeplitzOperator, ChannelSliced, Mixer):
    """Frequency-domain Toeplitz neural operator (name ``fd_tno``)."""

    options_type = FdTnoOptions
    fft_based = True
    inner_precision = "float32"  # the RPE reads frequencies, the product is an FFT one
    taps_depend_on_length = True  # the RPE is sampled on the FFT grid of the length

    def __init__(self, dim: int, causal: bool = False, options: FdTnoOptions | None = None):
        super().__init__(dim, causal, options)
        o = self.options
        self.rpe = RelativePositionEncoder(dim if causal else 2 * dim, o.rpe_dim, o.rpe_layers, o.activation)
        self._cache = Cache()

    def _basis(self, fft_size: int) -> torch.Tensor:
        """[features, 1] of the RPE at the rfft frequencies, (e + 1, N/2 + 1): the response is readout^T @ basis."""
        omega = rfft_frequencies(fft_size, self.rpe.output.weight.device)
        features = self.rpe.features(omega)
        basis = torch.cat([features, features.new_ones(features.shape[0], 1)], dim=1).t()
        return basis.to(spectral_dtype(basis.dtype))

    def _readout(self) -> torch.Tensor:
        return torch.cat([self.rpe.output.weight.t(), self.rpe.output.bias[None]], dim=0)

    def response(self, fft_size: int) -> torch.Tensor:
        """G at the rfft frequencies, (dim, N/2 + 1) complex, computed plainly (tests and plots)."""
        omega = rfft_frequencies(fft_size, self.rpe.output.weight.device)
        values = self.rpe(omega).t()
        if self.causal:
            return causal_spectrum(values, fft_size)
        real, imaginary = values[: self.dim], values[self.dim :].clone()
        imaginary[:, 0] = imaginary[:, -1] = 0.0
        return torch.complex(real, imaginary)

    def causal_factors(self, fft_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(causal basis spectra (e + 1, N/2 + 1), readout (e + 1, dim)): causal G = readout^T @ basis."""
        return causal_spectrum(self._basis(fft_size), fft_size), self._readout()

    def spectrum(self, fft_size: int, channels: slice = slice(None)) -> torch.Tensor:
        """The same G of ``channels`` via the factored form (what ``mix`` uses)."""
        if self.causal:
            basis, readout = self.causal_factors(fft_size)
            return complex_readout(basis, readout[:, channels])
        basis, readout = self._basis(fft_size), self._readout().view(-1, 2, self.dim)[..., channels]
        interior = torch.ones_like(basis[0])  # Im G = 0 at w = 0 and w = pi
        interior[0] = interior[-1] = 0.0
        real, imaginary = (readout.flatten(1).t().to(basis.dtype) @ basis).view(2, readout.shape[-1], -1).unbind(0)  # no zero-filled grads
        return torch.complex(real, imaginary * interior)

    def kernel(self, n: int) -> torch.Tensor:
        """Taps by lag of the Toeplitz operator at length n: (n, dim) causal, (2n - 1, dim) bidirectional."""
        if self.causal:
            return self.stream_taps(n, n)
        fft_size = fast_fft_size(2 * n)
        taps = torch.fft.irfft(self.response(fft_size), n=fft_size, dim=-1)
        return torch.cat([taps[:, fft_size - (n - 1) :], taps[:, :n]], dim=1).t()

    def stream_taps(self, lags: int, horizon: int) -> torch.Tensor:
        """Causal taps t_0 ... t_{lags-1}, (lags, dim), of the operator at length ``horizon`` (its grid)."""
        fft_size = fast_fft_size(2 * horizon)
        response = self.rpe(rfft_frequencies(fft_size, self.rpe.output.weight.device)).t()
        return causal_impulse_response(response, fft_size)[:, :lags].t()

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice) -> torch.Tensor:
        """Causal: the fused factored product. Bidirectional: Re and Im of G come from different readout
        rows, so G is formed by two matmuls and differentiated plainly."""
        fft_size = fast_fft_size(2 * x.shape[1])
        if self.causal:
            return cached_or_factored_matvec(self._cache, self, x, fft_size, fft_size, lambda: self.causal_factors(fft_size), channels)
        key = (fft_size, channels.start, channels.stop)
        return spectral_matvec(x, self._cache.get(key, lambda: self.spectrum(fft_size, channels), weights=self), fft_size)
