"""MEGA's multi-dimensional damped EMA mixer (Ma et al. 2023, §3.1).

Per channel d and expansion index j (``ndim`` = N): p = sigmoid(delta) is the input weight,
q = 1 - p sigmoid(a) the decay, and the kernel is k_d[l] = sum_j gamma_dj N^-1/2 p_dj beta_dj q_dj^l
(``ops/ema.py``). Output SiLU(k * x + omega x). Bidirectional: a second set of parameters runs
over the reversed sequence and the two kernels are summed (lag 0 counted in both).
Training applies the kernel by FFT with the kernel generated at every call (kernel generation
included, as in the paper's runtime study); ``naive_forward`` is the recurrence, for tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..fields import Integer, setting
from ..ops.ema import ema_chunk, ema_kernel, naive_ema
from ..ops.fft import spectral_dtype
from ..ops.toeplitz import toeplitz_matvec
from ..options import Options
from ..state import StreamState
from .base import PADDING_SIDES, ChannelSliced, Mixer, ToeplitzOperator
from .registry import register_mixer


@dataclass
class EmaState(StreamState):
    """The recurrence's hidden state h, (batch, dim, ndim): O(d N) whatever the position."""

    hidden: torch.Tensor


@dataclass
class EmaOptions(Options):
    ndim: int = setting(16, Integer(1), "expansion dimensions N of MEGA's damped EMA")


@register_mixer("ema")
class Ema(ToeplitzOperator, ChannelSliced, Mixer):
    """Damped EMA (name ``ema``), option ``ndim`` (N, default 16)."""

    options_type = EmaOptions
    fft_based = True
    inner_precision = "float32"  # the EMA kernel (powers of the damping) and its FFT product
    no_weight_decay = ("delta", "alpha", "beta", "gamma")
    padding_invariant_sides = PADDING_SIDES  # the kernel depends on the lag only
    bounded_state = True  # N values per channel
    static_decoding = True

    def __init__(self, dim: int, causal: bool = False, options: EmaOptions | None = None):
        super().__init__(dim, causal, options)
        self.ndim = ndim = self.options.ndim
        directions = 1 if self.causal else 2
        shape = (directions, dim, ndim)
        self.delta = nn.Parameter(torch.randn(shape) * 0.2)
        self.alpha = nn.Parameter(torch.randn(shape) * 0.2)
        signs = torch.tensor([(-1.0) ** j for j in range(ndim)])
        self.beta = nn.Parameter(torch.randn(shape) * 0.02 + signs)
        self.gamma = nn.Parameter(torch.randn(shape))
        self.omega = nn.Parameter(torch.randn(dim))

    def coefficients(self, channels: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input weight p beta, decay q, readout gamma / sqrt(N)), each (directions, channels, ndim).

        Computed in float32 (float64 stays float64): q^l over long lags needs the precision.
        """
        parameters = (self.delta, self.alpha, self.beta, self.gamma)
        delta, alpha, beta, gamma = (t[:, channels].to(spectral_dtype(t.dtype)) for t in parameters)
        p = torch.sigmoid(delta)
        return p * beta, 1.0 - p * torch.sigmoid(alpha), gamma / math.sqrt(self.ndim)

    def kernel(self, n: int, channels: slice = slice(None)) -> torch.Tensor:
        """By lag: (n, channels) for lags 0..n-1 (causal) or (2n - 1, channels) for -(n-1)..n-1."""
        kernels = ema_kernel(*self.coefficients(channels), n)  # (directions, n, channels)
        if self.causal:
            return kernels[0]
        zeros = kernels.new_zeros(n - 1, kernels.shape[-1])
        return torch.cat([zeros, kernels[0]], dim=0) + torch.cat([kernels[1].flip(0), zeros], dim=0)

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice) -> torch.Tensor:
        return F.silu(toeplitz_matvec(x, self.kernel(x.shape[1], channels), self.causal) + self.omega[channels].to(x.dtype) * x)

    state_type = EmaState

    def state_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return spectral_dtype(dtype)

    def empty_state(self, batch_size: int, device, dtype: torch.dtype, max_length: int | None) -> EmaState:
        return EmaState(torch.zeros(batch_size, self.dim, self.ndim, device=device, dtype=dtype))

    def step_chunk(self, x: torch.Tensor, state: EmaState, mask) -> tuple[torch.Tensor, EmaState]:
        """The chunk by FFT plus the carried state, and the closed-form state after it (``ops.ema.ema_chunk``)."""
        input_weight, decay, readout = (c[0].to(state.hidden.dtype) for c in self.coefficients())
        y, hidden = ema_chunk(x, state.hidden, input_weight, decay, readout)
        return F.silu(y + self.omega.to(x.dtype) * x), EmaState(hidden)

    def naive_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reference: the recurrence, forward (and over the reversed sequence); tests only."""
        input_weight, decay, readout = self.coefficients()
        y = naive_ema(x, input_weight[0], decay[0], readout[0])
        if not self.causal:
            y = y + naive_ema(x.flip(1), input_weight[1], decay[1], readout[1]).flip(1)
        return F.silu(y + self.omega * x)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, causal={self.causal}, ndim={self.ndim}"
