"""Relative position encoder (TNN paper 002, §3.3, Fig. 2; references.md).

RPE(k) = Linear(e, D)(act(norm(... act(norm(Linear(1, e)(k))) ...))) with L hidden Linear(e, e)
layers, the raw integer lag k as input (paper Table 8), and a parameter-free RMS norm
x / (||x|| / sqrt(e) + eps).
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.activations import get_activation
from ..validation import check_int


def rms_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMS norm over the last dimension."""
    return x / (x.norm(dim=-1, keepdim=True) * x.shape[-1] ** -0.5 + eps)


class RelativePositionEncoder(nn.Module):
    """MLP from a scalar position to ``out_features`` values."""

    def __init__(self, out_features: int, rpe_dim: int = 64, rpe_layers: int = 3, activation: str = "relu"):
        super().__init__()
        check_int(rpe_dim, "rpe_dim")
        check_int(rpe_layers, "rpe_layers", minimum=0)
        self.act = get_activation(activation)
        self.input = nn.Linear(1, rpe_dim)
        self.hidden_layers = nn.ModuleList(nn.Linear(rpe_dim, rpe_dim) for _ in range(rpe_layers))
        self.output = nn.Linear(rpe_dim, out_features)

    def features(self, positions: torch.Tensor) -> torch.Tensor:
        """Everything before the output layer: (P,) positions -> (P, rpe_dim)."""
        h = self.input(positions[:, None].to(self.input.weight.dtype))
        for layer in self.hidden_layers:
            h = layer(self.act(rms_normalize(h)))
        return self.act(rms_normalize(h))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.output(self.features(positions))
