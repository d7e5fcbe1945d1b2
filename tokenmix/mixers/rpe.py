"""Relative position encoder (TNN, Qin et al. 2023, §3.3, Fig. 2).

RPE(k) = Linear(e, D)(act(norm(... act(norm(Linear(1, e)(k))) ...))) with L hidden Linear(e, e)
layers, the raw integer lag k as input (paper Table 8), and a parameter-free RMS norm
x / (||x|| / sqrt(e) + eps). With ``in_features=2`` the first layer is Linear(2, e) and the input
is a 2-D offset (row, column), as in TNN's 2-D operator (``tno2d``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..fields import Choice, Integer, setting
from ..ops.activations import ACTIVATIONS, get_activation
from ..ops.interpolation import grid_weights, interpolation_matrix
from ..options import Options
from ..validation import check_int


def rms_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMS norm over the last dimension."""
    return x / (x.norm(dim=-1, keepdim=True) * x.shape[-1] ** -0.5 + eps)


@dataclass
class RpeOptions(Options):
    """The options of a mixer whose kernel an RPE MLP draws."""

    rpe_dim: int = setting(64, Integer(1), "width e of the relative position encoder (RPE) MLP")
    rpe_layers: int = setting(3, Integer(0), "hidden Linear(e, e) layers of the RPE (the TNN paper: 6 for its LM, 1 in small configs)")
    activation: str = setting("relu", Choice(sorted(ACTIVATIONS)), "RPE activation")


class RelativePositionEncoder(nn.Module):
    """MLP from a scalar position (or an ``in_features``-dimensional offset) to ``out_features`` values."""

    def __init__(self, out_features: int, rpe_dim: int = 64, rpe_layers: int = 3, activation: str = "relu", in_features: int = 1):
        super().__init__()
        check_int(rpe_dim, "rpe_dim")
        check_int(rpe_layers, "rpe_layers", minimum=0)
        self.act = get_activation(activation)
        self.input = nn.Linear(in_features, rpe_dim)
        self.hidden_layers = nn.ModuleList(nn.Linear(rpe_dim, rpe_dim) for _ in range(rpe_layers))
        self.output = nn.Linear(rpe_dim, out_features)

    def features(self, positions: torch.Tensor) -> torch.Tensor:
        """Everything before the output layer: (P,) positions or (..., in_features) offsets -> (..., rpe_dim)."""
        points = positions[:, None] if positions.dim() == 1 else positions
        h = self.input(points.to(self.input.weight.dtype))
        for layer in self.hidden_layers:
            h = layer(self.act(rms_normalize(h)))
        return self.act(rms_normalize(h))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.output(self.features(positions))


class PiecewiseLinearEncoder(nn.Module):
    """A learned piecewise-linear function [-1, 1] -> R^out with f(0) = 0 (Moreno et al. 2023, §3.2.2).

    Values sit at 2 * knots + 1 uniformly spaced knots (the middle one, at 0, fixed to zero) and
    are linearly interpolated in between: f(x) = B(x) @ V with B the (P, 2 * knots + 1) hat basis.
    Proposition 1 of Moreno et al. 2023: a ReLU MLP of a scalar is such a function anyway.
    """

    no_weight_decay = ("negative", "positive")

    def __init__(self, out_features: int, knots: int = 32, gain: float = 1.0):
        super().__init__()
        check_int(knots, "knots")
        self.knots, self.gain = knots, gain
        bound = knots**-0.5 / gain  # values = gain * parameters, uniform in +-1/sqrt(knots) at init
        self.negative = nn.Parameter(torch.empty(knots, out_features).uniform_(-bound, bound))
        self.positive = nn.Parameter(torch.empty(knots, out_features).uniform_(-bound, bound))

    def values(self) -> torch.Tensor:
        """(2 * knots + 1, out) values at the knots -1 ... 1, zero in the middle."""
        zero = self.negative.new_zeros(1, self.negative.shape[1])
        return torch.cat([self.negative, zero, self.positive]) * self.gain

    def basis(self, points: torch.Tensor) -> torch.Tensor:
        """(P, 2 * knots + 1) hat functions at points in [-1, 1]."""
        coordinates = ((points.to(torch.float64).clamp(-1, 1) + 1) * self.knots).clamp(0, 2 * self.knots)
        index, weight = grid_weights(coordinates, 2 * self.knots + 1, degree=1)
        return interpolation_matrix(index, weight.to(self.positive.dtype), 2 * self.knots + 1)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.basis(points) @ self.values()
