"""Gated linear units (TNN, Qin et al. 2023, §3.4, Fig. 2)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..mixers.base import zero_padding
from ..ops.activations import get_activation
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


class Gtu(StreamingBlock, nn.Module):
    """Gated token unit: W_o(u * Mixer(v)), u = act(W_u x), v = act(W_v x), at the mixer's width.

    The token mixer (a TNO in TNN) is any registered mixer, so SKI/FD variants reuse this block.
    ``build_mixer`` is called after the gate and value projections are drawn, so one seed gives
    one set of initial weights whatever the mixer."""

    def __init__(self, dim: int, width: int, build_mixer: Callable[[], nn.Module], activation: str = "silu", dropout: float = 0.0):
        super().__init__()
        self.act = get_activation(activation, "gtu_activation")
        self.gate = nn.Linear(dim, width)
        self.value = nn.Linear(dim, width)
        self.mixer = build_mixer()
        self.out = nn.Linear(width, dim)
        self.dropout = nn.Dropout(dropout)

    def stream_parts(self) -> list:
        return [self.mixer]

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        u = self.act(self.gate(x))
        v = self.act(self.value(x))
        mixed = run(self.mixer, v)
        return zero_padding(self.out(self.dropout(u * mixed)), mask)
