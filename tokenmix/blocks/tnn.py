"""TNN block (TNN, Qin et al. 2023, §3.4, Fig. 2): x + GTU(norm(x)), then x + GLU(norm(x)) (pre-norm)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ..fields import Choice, Integer, Number, setting
from ..mixers.parts import Configurable, Part
from ..mixers.registry import list_mixers
from ..ops.activations import ACTIVATIONS
from ..options import Options, dropout_setting
from .glu import Glu, Gtu
from .streaming import StreamingBlock


@dataclass
class TnnOptions(Options):
    expand: int = setting(3, Integer(1), "GTU width factor: its mixer works on expand * dim channels")
    gtu_activation: str = setting("silu", Choice(sorted(ACTIVATIONS)), "activation of the GTU's gate and value")
    glu_expand: float = setting(1.0, Number(0, open_minimum=True), "GLU width factor")
    glu_activation: str = setting("silu", Choice(sorted(ACTIVATIONS)), "GLU activation")
    dropout: float = dropout_setting()


class TnnBlock(StreamingBlock, Configurable, nn.Module):
    """GTU around any registered ``mixer`` (``tno`` in TNN), then a GLU."""

    options_type = TnnOptions

    @classmethod
    def parts(cls) -> list[Part]:
        return [Part("mixer", "tno", list_mixers, width=lambda own, dim: own.expand * dim)]

    def __init__(self, dim: int, causal: bool, options: TnnOptions | None = None):
        super().__init__()
        self.take_options(options, dim)
        o = self.options
        self.token_norm = nn.LayerNorm(dim)
        width = o.expand * dim
        self.token_mixing = Gtu(dim, width, partial(self.build_part, "mixer", width, causal), o.gtu_activation, o.dropout)
        self.channel_norm = nn.LayerNorm(dim)
        self.channel_mixing = Glu(dim, o.glu_expand, o.glu_activation, o.dropout)
        self.dropout = nn.Dropout(o.dropout)

    def stream_parts(self) -> list:
        return [self.token_mixing]

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        x = x + self.dropout(run(self.token_mixing, self.token_norm(x)))
        return x + self.dropout(self.channel_mixing(self.channel_norm(x), mask))
