"""FNet and FNetAR token mixers (FNetAR, Lou et al. 2021, §II.3-II.4; the math is in ``ops/fourier.py``)."""

from __future__ import annotations

import torch

from ..ops.fourier import fnet_mixing, fourier_ar_mix
from ..validation import check_int
from .base import Mixer, check_sequence, zero_padding
from .registry import register_mixer


@register_mixer("fnet")
class Fnet(Mixer):
    """Re(FFT) over sequence and hidden dims (FNet); ``sequence_only=True`` skips the hidden FFT.

    Bidirectional only: every output depends on every input.
    """

    fft_based = True
    causal_modes = (False,)

    def __init__(self, dim: int, causal: bool = False, *, sequence_only: bool = False):
        if causal:
            raise ValueError("fnet mixes the whole sequence and cannot be causal; use fnet_ar for causal mixing")
        super().__init__(dim, causal)
        self.sequence_only = bool(sequence_only)

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return fnet_mixing(x, self.sequence_only)


@register_mixer("fnet_ar")
class FnetAr(Mixer):
    """FNetAR causal Fourier mixing with window W (option ``window``, default 512), parameter free.

    ``forward(x)`` treats x as a stream that starts at x[0]; ``mix_stream`` continues a stream
    from its ``history`` (the previous inputs, newest last) and the stream position ``start``.
    """

    causal_modes = (True,)

    def __init__(self, dim: int, causal: bool = True, *, window: int = 512):
        if not causal:
            raise ValueError("fnet_ar is causal by construction: build it with causal=True")
        check_int(window, "window")
        super().__init__(dim, causal)
        self.window = window

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return fourier_ar_mix(x, self.window)

    def mix_stream(self, x: torch.Tensor, mask: torch.Tensor | None, history: torch.Tensor | None, start: int) -> torch.Tensor:
        check_sequence(x, self.dim, mask)
        return fourier_ar_mix(zero_padding(x, mask), self.window, history, start)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, window={self.window}"
