"""Plain pre-norm blocks: x + M_1(norm(x)), ..., x + M_k(norm(x)), then x + FFN(norm(x)).

- ``TransformerBlock``: one full-attention mixer (the Transformer baseline; rotary positions).
- ``TcncaSimpleBlock``: TCN, then chunked attention (TCNCA-simple, Terzić et al. 2023, Appendix C, Fig. 4:
  TCN -> chunked attention -> MLP without MEGA's gates and highway; our reading of the figure is
  a plain pre-norm residual around each of the three).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..fields import Number, setting
from ..mixers.parts import Configurable, Part
from ..options import Options, dropout_setting
from .ffn import Ffn
from .streaming import StreamingBlock


class PreNormBlock(StreamingBlock, Configurable, nn.Module):
    """A pre-norm residual around each of its ``parts()``, in order, then around the FFN."""

    ffn_activation = "gelu"

    def __init__(self, dim: int, causal: bool, options: Options | None = None):
        super().__init__()
        self.take_options(options, dim)
        self.mixers = nn.ModuleList(self.build_part(part.key, dim, causal) for part in self.parts())
        self.mixer_norms = nn.ModuleList(nn.LayerNorm(dim) for _ in self.mixers)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = Ffn(dim, self.options.ffn_expand, self.ffn_activation, self.options.dropout)
        self.dropout = nn.Dropout(self.options.dropout)

    def stream_parts(self) -> list:
        return list(self.mixers)

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        for norm, mixer in zip(self.mixer_norms, self.mixers, strict=True):
            x = x + self.dropout(run(mixer, norm(x)))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


@dataclass
class TransformerOptions(Options):
    ffn_expand: float = setting(4, Number(0, open_minimum=True), "width factor of the GELU FFN")
    dropout: float = dropout_setting()


class TransformerBlock(PreNormBlock):
    options_type = TransformerOptions

    @classmethod
    def parts(cls) -> list[Part]:
        return [Part("attention", "attention")]


@dataclass
class TcncaSimpleOptions(Options):
    ffn_expand: float = setting(2, Number(0, open_minimum=True), "width factor of the SiLU MLP")
    dropout: float = dropout_setting()


class TcncaSimpleBlock(PreNormBlock):
    options_type = TcncaSimpleOptions
    ffn_activation = "silu"

    @classmethod
    def parts(cls) -> list[Part]:
        return [Part("tcn", "tcn"), Part("attention", "chunked_attention", defaults={"heads": 1})]
