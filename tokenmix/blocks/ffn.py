"""Position-wise feed-forward network: Linear(d, expand d) -> activation -> dropout -> Linear(expand d, d)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.activations import get_activation
from ..validation import check_number


class Activation(nn.Module):
    """An activation chosen by name, as a module."""

    def __init__(self, name: str, argument: str = "activation"):
        super().__init__()
        self.name = name
        self.function = get_activation(name, argument)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)

    def extra_repr(self) -> str:
        return self.name


class Ffn(nn.Sequential):
    """The Transformer FFN (GELU in Transformer-XL, SiLU in MEGA's normalized FFN)."""

    def __init__(self, dim: int, expand: float = 4, activation: str = "gelu", dropout: float = 0.0):
        check_number(expand, "ffn_expand", 0, open_minimum=True)
        inner = max(1, round(expand * dim))  # Transformer-XL base: d_inner 2100 at d 410, expand 2100 / 410
        super().__init__(nn.Linear(dim, inner), Activation(activation), nn.Dropout(dropout), nn.Linear(inner, dim))
