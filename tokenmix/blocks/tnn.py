"""TNN block (TNN, Qin et al. 2023, §3.4, Fig. 2): x + GTU(norm(x)), then x + GLU(norm(x)) (pre-norm)."""

from __future__ import annotations

import torch
from torch import nn

from ..options import Configurable, merge_options, take_options
from .glu import Glu, Gtu
from .streaming import StreamingBlock


class TnnBlock(StreamingBlock, Configurable, nn.Module):
    def __init__(
        self,
        dim: int,
        causal: bool,
        dropout: float = 0.0,
        glu_expand: float = 1.0,
        glu_activation: str = "silu",
        **gtu_options,
    ):
        super().__init__()
        self.token_norm = nn.LayerNorm(dim)
        self.token_mixing = Gtu(dim, causal, dropout=dropout, **gtu_options)
        self.channel_norm = nn.LayerNorm(dim)
        self.channel_mixing = Glu(dim, glu_expand, glu_activation, dropout)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def resolve_options(cls, options: dict, dim: int) -> tuple[dict, dict]:
        """The block's options and its GTU's (which shares ``dropout``), defaults filled in."""
        own, rest = take_options(cls.__init__, options)
        gtu_options, unknown = Gtu.resolve_options({**rest, "dropout": own["dropout"]}, dim)
        return merge_options(own, gtu_options, "the TNN block", shared=("dropout",)), unknown

    def stream_parts(self) -> list:
        return [self.token_mixing]

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        x = x + self.dropout(run(self.token_mixing, self.token_norm(x)))
        return x + self.dropout(self.channel_mixing(self.channel_norm(x), mask))
