"""Gated linear units (TNN, Qin et al. 2023, §3.4, Fig. 2)."""

from __future__ import annotations

import torch
from torch import nn

from ..mixers.base import zero_padding
from ..mixers.registry import build_mixer, mixer_class, shared_options
from ..ops.activations import get_activation
from ..options import Configurable, merge_options, take_options
from ..validation import check_int
from .streaming import StreamingBlock


class Glu(nn.Module):
    """GLU channel mixer: W_3(act(W_1 x) * W_2 x), hidden width ``dim * glu_expand``."""

    def __init__(self, dim: int, glu_expand: float = 1.0, glu_activation: str = "silu", dropout: float = 0.0):
        super().__init__()
        hidden = max(1, int(round(dim * glu_expand)))
        self.act = get_activation(glu_activation, "glu_activation")
        self.gate = nn.Linear(dim, hidden)
        self.value = nn.Linear(dim, hidden)
        self.out = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.out(self.dropout(self.act(self.gate(x)) * self.value(x)))


class Gtu(StreamingBlock, Configurable, nn.Module):
    """Gated token unit: W_o(u * Mixer(v)), u = act(W_u x), v = act(W_v x), width expand * dim.

    The token mixer (a TNO in TNN) is built by name, so SKI/FD variants reuse this block.
    """

    def __init__(
        self,
        dim: int,
        causal: bool,
        mixer: str = "tno",
        expand: int = 3,
        gtu_activation: str = "silu",
        dropout: float = 0.0,
        **mixer_options,
    ):
        super().__init__()
        check_int(expand, "expand")
        width = expand * dim
        self.act = get_activation(gtu_activation, "gtu_activation")
        self.gate = nn.Linear(dim, width)
        self.value = nn.Linear(dim, width)
        self.mixer = build_mixer(mixer, width, causal, **mixer_options, **shared_options(mixer, dropout=dropout))
        self.out = nn.Linear(width, dim)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def resolve_options(cls, options: dict, dim: int) -> tuple[dict, dict]:
        """The GTU's options and its mixer's (chosen by ``mixer``, at width expand * dim), defaults filled in."""
        own, rest = take_options(cls.__init__, options)
        shared = shared_options(own["mixer"], dropout=own["dropout"])
        mixer_options, unknown = mixer_class(own["mixer"]).resolve_options({**rest, **shared}, check_int(own["expand"], "expand") * dim)
        return merge_options(own, mixer_options, f"the GTU with mixer {own['mixer']!r}", shared=shared), unknown

    def stream_parts(self) -> list:
        return [self.mixer]

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        u = self.act(self.gate(x))
        v = self.act(self.value(x))
        mixed = run(self.mixer, v)
        return zero_padding(self.out(self.dropout(u * mixed)), mask)
