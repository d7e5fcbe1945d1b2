"""Plain pre-norm blocks: x + M_1(norm(x)), ..., x + M_k(norm(x)), then x + FFN(norm(x)).

- ``TransformerBlock``: one full-attention mixer (the Transformer baseline; rotary positions).
- ``TcncaSimpleBlock``: TCN, then chunked attention (TCNCA-simple, Terzić et al. 2023, Appendix C, Fig. 4:
  TCN -> chunked attention -> MLP without MEGA's gates and highway; our reading of the figure is
  a plain pre-norm residual around each of the three).
"""

from __future__ import annotations

import torch
from torch import nn

from ..mixers.attention import relative_reach
from ..mixers.registry import build_mixer
from ..options import Configurable, take_options
from .ffn import Ffn
from .mega import resolve_with_sequence_mixer, sequence_options
from .streaming import StreamingBlock


class PreNormBlock(StreamingBlock, Configurable, nn.Module):
    def __init__(self, dim: int, mixers: list[nn.Module], ffn_expand: float, ffn_activation: str, dropout: float):
        super().__init__()
        self.mixers = nn.ModuleList(mixers)
        self.mixer_norms = nn.ModuleList(nn.LayerNorm(dim) for _ in mixers)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = Ffn(dim, ffn_expand, ffn_activation, dropout)
        self.dropout = nn.Dropout(dropout)

    def stream_parts(self) -> list:
        return list(self.mixers)

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        for norm, mixer in zip(self.mixer_norms, self.mixers, strict=True):
            x = x + self.dropout(run(mixer, norm(x)))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class TransformerBlock(PreNormBlock):
    def __init__(
        self,
        dim: int,
        causal: bool,
        heads: int = 4,
        chunk_size: int | None = None,
        position: str = "rotary",
        max_distance: int | None = None,
        ffn_expand: float = 4,
        dropout: float = 0.0,
    ):
        attention = build_mixer("attention", dim, causal, heads=heads, chunk_size=chunk_size, position=position, max_distance=max_distance)
        super().__init__(dim, [attention], ffn_expand, "gelu", dropout)

    @classmethod
    def resolve_options(cls, options: dict, dim: int) -> tuple[dict, dict]:
        own, unknown = take_options(cls.__init__, options)
        return {**own, "max_distance": relative_reach(own["max_distance"], own["chunk_size"])}, unknown


class TcncaSimpleBlock(PreNormBlock):
    def __init__(
        self,
        dim: int,
        causal: bool,
        chunk_size: int = 128,
        heads: int = 1,
        position: str = "rotary",
        max_distance: int | None = None,
        ffn_expand: float = 2,
        dropout: float = 0.0,
        tcn_depth: int | None = None,
        **tcn_options,
    ):
        tcn = build_mixer("tcn", dim, causal, **sequence_options("tcn", tcn_depth, tcn_options))
        attention = build_mixer(
            "chunked_attention", dim, causal, chunk_size=chunk_size, heads=heads, position=position, max_distance=max_distance
        )
        super().__init__(dim, [tcn, attention], ffn_expand, "silu", dropout)

    @classmethod
    def resolve_options(cls, options: dict, dim: int) -> tuple[dict, dict]:
        own, rest = take_options(cls.__init__, options)
        return resolve_with_sequence_mixer(own, rest, "tcn", dim)
