"""FNet and FNetAR token mixers (FNetAR, Lou et al. 2021, §II.3-II.4; the math is in ``ops/fourier.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fields import Flag, Integer, setting
from ..ops.fft import spectral_dtype
from ..ops.fourier import fnet_mixing, fourier_ar_matrix, fourier_ar_mix
from ..options import Options
from ..state import StreamState
from .base import Mixer, zero_padding
from .registry import register_mixer


@dataclass
class FnetOptions(Options):
    sequence_only: bool = setting(False, Flag(), "Re(FFT) over the sequence only, instead of over sequence and hidden dimensions")


class SequenceFourier:
    """FNet's FFT over the sequence, channel by channel (each on its own: ``mix_channels``): Re(FFT) of
    channels [0, real) and -Im(FFT) of the rest. For x = [Re z, Im z] of a complex z (batch, n, d) and
    real = d, the two halves of the output add up to Re(FFT z), as Re(F (a + ib)) = Re(F a) - Im(F b)."""

    sequence_split = "channels"
    inner_precision = "float32"  # as a mixer's (``Mixer.inner_precision``): its FFT in float32

    def __init__(self, dim: int, real: int):
        self.dim, self.real = dim, real

    def mix_channels(self, x: torch.Tensor, mask: torch.Tensor | None, channels: slice) -> torch.Tensor:
        low, high, _ = channels.indices(self.dim)
        spectrum = torch.fft.fft(x.to(spectral_dtype(x.dtype)), dim=1)
        count = min(max(self.real - low, 0), high - low)  # of these channels, the real ones
        return torch.cat([spectrum[..., :count].real, -spectrum[..., count:].imag], dim=-1).to(x.dtype)


@register_mixer("fnet")
class Fnet(Mixer):
    """Re(FFT) over sequence and hidden dims (FNet); ``sequence_only=True`` skips the hidden FFT.

    Bidirectional only: every output depends on every input. Split over processes (``body``), the FFT
    over the hidden dim is token-wise and the one over the sequence mixes each channel on its own
    (``SequenceFourier``, split by channels): the 2-D FFT in two steps.
    """

    sequence_split = "body"

    options_type = FnetOptions
    fft_based = True
    inner_precision = "float32"  # FFTs over the sequence and the hidden dimension
    causal_modes = (False,)

    def __init__(self, dim: int, causal: bool = False, options: FnetOptions | None = None):
        if causal:
            raise ValueError("fnet mixes the whole sequence and cannot be causal; use fnet_ar for causal mixing")
        super().__init__(dim, causal, options)
        self.sequence_only = self.options.sequence_only
        self.sequence_fourier = SequenceFourier(dim, dim) if self.sequence_only else SequenceFourier(2 * dim, dim)

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return fnet_mixing(x, self.sequence_only)

    def stream_parts(self) -> list:
        return [self.sequence_fourier]

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        """``mix`` with the FFT over the sequence run by ``run`` (context parallelism: over channel shards)."""
        x = zero_padding(x, mask)
        if self.sequence_only:
            return run(self.sequence_fourier, x)
        z = torch.fft.fft(x.to(spectral_dtype(x.dtype)), dim=-1)
        y = run(self.sequence_fourier, torch.cat([z.real, z.imag], dim=-1).to(x.dtype))
        return y[..., : self.dim] + y[..., self.dim :]


@dataclass
class FnetArState(StreamState):
    """The last W - 1 inputs (batch, W - 1, dim), newest last (zeros before the stream), and the position."""

    history: torch.Tensor
    position: int = 0


@dataclass
class StaticFnetArState(StreamState):
    """``FnetArState`` in fixed buffers: the last W - 1 inputs (batch, W - 1, dim) and each row's position (batch,) on
    the device, both updated in place."""

    history: torch.Tensor
    position: torch.Tensor


@dataclass
class FnetArOptions(Options):
    window: int = setting(
        512, Integer(1), "W: position i = t mod W of each window segment mixes the W inputs ending at t with the real part of DFT row i"
    )


@register_mixer("fnet_ar")
class FnetAr(Mixer):
    """FNetAR causal Fourier mixing with window W (option ``window``, default 512), parameter free.

    ``forward(x)`` treats x as a stream that starts at x[0]; ``step`` continues it from the window
    buffer: the last W - 1 inputs and the stream position (which DFT row each token uses).
    """

    options_type = FnetArOptions
    causal_modes = (True,)
    channelwise_linear = True
    bounded_state = True  # the last window - 1 inputs
    mixes_context = True
    normalize_output = True
    state_type = FnetArState
    inner_precision = "float32"  # DFT rows of window W over the window buffer
    padding_invariant_sides = ("right",)  # a token's DFT row is its position counted from the first token

    @property
    def front_padding_period(self) -> int:
        """Whole windows of padding keep every token's DFT row (t mod W)."""
        return self.window

    def __init__(self, dim: int, causal: bool = True, options: FnetArOptions | None = None):
        if not causal:
            raise ValueError("fnet_ar is causal by construction: build it with causal=True")
        super().__init__(dim, causal, options)
        self.window = self.options.window

    @property
    def reach(self) -> tuple[int, int]:
        """The window: the W - 1 tokens before each."""
        return self.window - 1, 0

    def halo_span(self, start: int, stop: int, length: int) -> tuple[int, int]:
        """The window before ``start``, from a multiple of W (a token's DFT row is its position mod W)."""
        window = self.window
        return max(0, (start - window + 1) // window * window), stop

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return fourier_ar_mix(x, self.window)

    def mix_context(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor, start: int) -> torch.Tensor:
        """The newest n inputs x mixed with the context before them (``context`` ends with x; padded
        keys, False in ``key_mask``, read as zeros) as the window buffer; x's first token is at stream
        position ``start`` (its DFT row)."""
        n, window = x.shape[1], self.window
        before = context[:, :-n].masked_fill(~key_mask[:, :-n, None], 0.0)[:, -(window - 1) :] if window > 1 else context[:, :0]
        history = torch.nn.functional.pad(before, (0, 0, window - 1 - before.shape[1], 0))
        return self.step_chunk(x.masked_fill(~key_mask[:, -n:, None], 0.0), FnetArState(history, start), None)[0]

    static_context = True

    def mix_static_context(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token per row at stream positions ``positions`` (batch,): y_t = sum_m cos(2 pi (t mod W) m / W) x_{t-W+1+m}
        over the last W inputs of ``context`` (masked keys, and any before it, read as zeros), its DFT row gathered
        from ``fourier_ar_matrix`` by t mod W on the device."""
        window, work = self.window, spectral_dtype(x.dtype)
        inputs = context.masked_fill(~key_mask[..., None], 0.0)[:, -window:].to(work)
        inputs = torch.nn.functional.pad(inputs, (0, 0, window - inputs.shape[1], 0))
        row = positions.remainder(window)[:, None]
        coefficients = fourier_ar_matrix(window, work, x.device)[row, row + torch.arange(window, device=x.device)]
        return torch.einsum("bw,bwd->bd", coefficients, inputs)[:, None].to(x.dtype)

    static_decoding = True

    def static_state(self, state: FnetArState, capacity: int) -> StaticFnetArState:
        """The window buffer copied, the position on the device (``Mixer.static_state``: a window needs no more room)."""
        history = state.history
        return StaticFnetArState(history.clone(), torch.full((history.shape[0],), state.position, dtype=torch.long, device=history.device))

    def static_step(self, x: torch.Tensor, state: StaticFnetArState) -> torch.Tensor:
        """``mix_static_context`` over [history; x], the window shifted by one in place (``Mixer.static_step``)."""
        return self.in_inner_precision(self._window_step, x, state)

    def _window_step(self, x: torch.Tensor, state: StaticFnetArState) -> torch.Tensor:
        window = torch.cat([state.history, x.to(state.history.dtype)], dim=1)
        y = self.mix_static_context(x, window, torch.ones(window.shape[:2], dtype=torch.bool, device=x.device), state.position)
        state.history.copy_(window[:, 1:])
        state.position += 1
        return y

    def empty_state(self, batch_size: int, device, dtype: torch.dtype, max_length: int | None) -> FnetArState:
        return FnetArState(torch.zeros(batch_size, self.window - 1, self.dim, device=device, dtype=dtype))

    def step_chunk(self, x: torch.Tensor, state: FnetArState, mask) -> tuple[torch.Tensor, FnetArState]:
        y = fourier_ar_mix(x, self.window, state.history, state.position)
        history = torch.cat([state.history, x], dim=1)[:, x.shape[1] :]
        return y, FnetArState(history, state.position + x.shape[1])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, window={self.window}"
