"""Diagonal state-space mixer (name ``ssm``): a causal convolution per channel whose kernel is a short
exact window plus a sum of damped complex exponentials, decoded in constant memory.

Per channel, lags l < W (``window``) have free taps h_l; lags l >= W follow N (``order``) modes,
k[l] = Re sum_n r_n p_n^(l - W) (``ops/modal.py``): the form LaughingHyena distils long
convolutions into (Massaroli et al. 2023, "Laughing Hyena Distillery", arXiv 2310.18780, §3), with
StripedHyena's short exact filter beside it. Poles are p = sigmoid(a) e^(i theta), inside the unit
circle whatever a and theta (stable by construction). The parallel forward applies the kernel by
FFT; decoding keeps the last W inputs and N complex states per channel, whatever the position:
y_t = sum_{l<W} h_l x_(t-l) + Re sum_n r_n s_t[n], s_t = p s_(t-1) + x_(t-W).
``tokenmix.distil`` fits it to a trained Toeplitz mixer's kernel; it also trains like any mixer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..fields import Integer, setting
from ..ops.fft import spectral_dtype
from ..ops.modal import modal_chunk, modal_kernel, naive_modal
from ..ops.toeplitz import toeplitz_matvec
from ..options import Options
from ..state import StreamState
from .base import PADDING_SIDES, ChannelSliced, Mixer, ToeplitzOperator
from .registry import register_mixer


@dataclass
class SsmState(StreamState):
    """The last ``window`` inputs (batch, W, dim) and the modes' states as (real, imaginary) pairs
    (batch, dim, order, 2): a size fixed by the options, not by the position."""

    recent: torch.Tensor
    modes: torch.Tensor


@dataclass
class SsmOptions(Options):
    order: int = setting(16, Integer(1), "complex modes per channel (the state: order complex numbers per channel)")
    window: int = setting(0, Integer(0), "first lags kept as free taps (a short exact convolution beside the modes)")


@register_mixer("ssm")
class Ssm(ToeplitzOperator, ChannelSliced, Mixer):
    """Diagonal state space (name ``ssm``), causal; options ``order`` (N, default 16) and ``window`` (W, default 0)."""

    options_type = SsmOptions
    causal_modes = (True,)
    fft_based = True
    inner_precision = "float32"  # powers of complex poles and their FFT product
    channelwise_linear = True
    bounded_state = True
    static_decoding = True
    padding_invariant_sides = PADDING_SIDES  # the kernel depends on the lag only
    no_weight_decay = ("pole_logit", "pole_angle", "residue", "taps")

    def __init__(self, dim: int, causal: bool = True, options: SsmOptions | None = None):
        if not causal:
            raise ValueError("ssm is causal (a recurrence over earlier tokens): build it with causal=True")
        super().__init__(dim, causal, options)
        self.order, self.window = order, window = self.options.order, self.options.window
        # Magnitudes spread over (0.5, 0.999), angles over [0, pi): slow and fast, smooth and oscillating modes.
        magnitude = 1.0 - torch.logspace(math.log10(0.5), -3, order)
        self.pole_logit = nn.Parameter(torch.logit(magnitude).expand(dim, order).clone())
        self.pole_angle = nn.Parameter((torch.arange(order) * math.pi / order).expand(dim, order).clone())
        self.residue = nn.Parameter(torch.randn(dim, order, 2) / math.sqrt(2 * order))
        self.taps = nn.Parameter(torch.randn(dim, window) / math.sqrt(max(window, 1)))

    def modes(self, channels: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """(poles, residues), complex128 (channels, order): powers p^l over thousands of lags need the precision
        (in complex64 a chunked stream and one forward drift apart by 1e-5 at 1000 tokens)."""
        logit, angle = self.pole_logit[channels].double(), self.pole_angle[channels].double()
        return torch.polar(torch.sigmoid(logit), angle), torch.view_as_complex(self.residue[channels].double().contiguous())

    def _cached_modes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``modes()`` outside autograd, computed again only when a parameter is changed in place (its version) or
        replaced (its storage): a decoding step would otherwise spend a third of its time on the poles' polar form
        (a compiled step computes them in its graph instead: the storage's address is no value a graph can compare).
        The cache holds the parameters it was made from, so their storage cannot be reused by another tensor."""
        parameters = (self.pole_logit, self.pole_angle, self.residue)
        key = [(parameter.detach(), parameter._version) for parameter in parameters]
        cached = getattr(self, "_modes_cache", None)
        same = cached is not None and all(
            kept.data_ptr() == parameter.data_ptr() and kept.dtype == parameter.dtype and kept.device == parameter.device
            and version == parameter._version
            for (kept, version), parameter in zip(cached[0], parameters, strict=True)
        )  # fmt: skip
        if not same:
            self._modes_cache = cached = (key, self.modes())
        return cached[1]

    def set_modes(self, poles: torch.Tensor, residues: torch.Tensor, taps: torch.Tensor | None = None) -> None:
        """Load fitted modes: poles (dim, order) complex with 0 < |p| < 1, residues (dim, order) complex, taps (dim, window)."""
        expected = (self.dim, self.order)
        if tuple(poles.shape) != expected or tuple(residues.shape) != expected:
            raise ValueError(f"poles and residues must be (dim, order) = {expected}, got {tuple(poles.shape)} and {tuple(residues.shape)}")
        magnitude = poles.abs().double()
        if not bool(((magnitude > 0) & (magnitude < 1)).all()):
            raise ValueError(
                f"poles must lie strictly inside the unit circle and off 0, got magnitudes in [{magnitude.min()}, {magnitude.max()}]"
            )
        with torch.no_grad():
            self.pole_logit.copy_(torch.logit(magnitude))
            self.pole_angle.copy_(poles.angle())
            self.residue.copy_(torch.view_as_real(residues.to(torch.complex128)))
            if taps is not None:
                if tuple(taps.shape) != (self.dim, self.window):
                    raise ValueError(f"taps must be (dim, window) = {(self.dim, self.window)}, got {tuple(taps.shape)}")
                self.taps.copy_(taps)

    def kernel(self, n: int, channels: slice = slice(None)) -> torch.Tensor:
        """Taps by lag, (n, channels): the window's free taps, then the modes' k[l] = Re sum r p^(l - W)."""
        taps = self.taps[channels].t()[:n]
        if n <= self.window:
            return taps
        modal = modal_kernel(*self.modes(channels), n - self.window)
        return torch.cat([taps.to(modal.dtype), modal], dim=0).to(self.taps.dtype)

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice) -> torch.Tensor:
        return toeplitz_matvec(x, self.kernel(x.shape[1], channels).to(x.dtype), causal=True)

    state_type = SsmState

    def state_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return spectral_dtype(dtype)

    def empty_state(self, batch_size: int, device, dtype: torch.dtype, max_length: int | None) -> SsmState:
        recent = torch.zeros(batch_size, self.window, self.dim, device=device, dtype=dtype)
        return SsmState(recent, torch.zeros(batch_size, self.dim, self.order, 2, device=device, dtype=dtype))

    def step_chunk(self, x: torch.Tensor, state: SsmState, mask) -> tuple[torch.Tensor, SsmState]:
        """The window's taps over [recent; x], plus the modes fed with the inputs W tokens back, from their state."""
        k, window = x.shape[1], self.window
        inputs = torch.cat([state.recent, x.to(state.recent.dtype)], dim=1)  # (batch, W + k, dim)
        poles, residues = self.modes() if torch.is_grad_enabled() or torch.compiler.is_compiling() else self._cached_modes()
        y, modes = modal_chunk(inputs[:, :k], torch.view_as_complex(state.modes.contiguous()), poles, residues)
        if window and k == 1:  # one token (a decoding step, a CUDA graph's): sum_l h_l x_{t-l} directly, no FFT plan to make
            y = y + (inputs[:, 1:].flip(1).to(y.dtype) * self.taps.t().to(y.dtype)).sum(1, keepdim=True)
        elif window:
            taps = torch.cat([self.taps.t().to(y.dtype), y.new_zeros(k, self.dim)], dim=0)
            y = y + toeplitz_matvec(inputs, taps, causal=True)[:, window:]
        return y.to(x.dtype), SsmState(inputs[:, k:], torch.view_as_real(modes).to(state.modes.dtype))

    def naive_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reference: the window's taps as a loop over lags and the modes' recurrence as a loop over time; tests only."""
        window = self.window
        delayed = torch.cat([x.new_zeros(x.shape[0], window, x.shape[2]), x], dim=1)[:, : x.shape[1]]
        poles, residues = self.modes()
        y = naive_modal(delayed.to(poles.real.dtype), poles, residues)
        for lag in range(min(window, x.shape[1])):
            y[:, lag:] = y[:, lag:] + self.taps[:, lag].to(y.dtype) * x[:, : x.shape[1] - lag].to(y.dtype)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, order={self.order}, window={self.window}"
