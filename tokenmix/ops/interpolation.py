"""Polynomial interpolation on a uniform grid (SKI-TNN, Moreno et al. 2023, §3.2.1 and §3.2.2).

A query at grid coordinate u (grid points at 0, 1, ..., G - 1) is a weighted sum of s = degree + 1
neighbouring grid values: linear (s = 2) uses the two points around u, cubic (s = 4) the Lagrange
polynomial through the four nearest ones (the stencil shifts inward at the ends). Rows of weights
sum to 1, and the rule is exact for polynomials of its degree. A query that lands on a grid point
reproduces that point's value.
"""

from __future__ import annotations

import torch

DEGREES = {"linear": 1, "cubic": 3}


def check_interpolation(interpolation: str) -> int:
    """Degree of a named interpolation; ValueError for an unknown name."""
    if interpolation not in DEGREES:
        raise ValueError(f"interpolation must be one of {sorted(DEGREES)}, got {interpolation!r}")
    return DEGREES[interpolation]


def grid_weights(coordinates: torch.Tensor, grid_size: int, degree: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse interpolation rows for queries at ``coordinates`` (P,) in [0, grid_size - 1].

    Returns ``index`` (P, s) int64 and ``weight`` (P, s), s = min(degree + 1, grid_size):
    value(u) = sum_a weight[:, a] * grid[index[:, a]].
    """
    stencil = min(degree + 1, grid_size)
    first = torch.floor(coordinates).long() - (stencil - 1) // 2
    first = first.clamp(0, grid_size - stencil)
    offsets = torch.arange(stencil, device=coordinates.device)
    index = first[:, None] + offsets
    local = coordinates[:, None] - first[:, None].to(coordinates.dtype)  # u relative to the stencil start
    weight = torch.ones_like(local.expand(-1, stencil))
    for a in range(stencil):  # Lagrange basis: prod_{b != a} (u - b) / (a - b)
        for b in range(stencil):
            if a != b:
                weight[:, a] = weight[:, a] * (local[:, 0] - b) / (a - b)
    return index, weight


def interpolation_matrix(index: torch.Tensor, weight: torch.Tensor, grid_size: int) -> torch.Tensor:
    """The dense (P, grid_size) matrix of the sparse rows (duplicate indices add up)."""
    matrix = weight.new_zeros(index.shape[0], grid_size)
    return matrix.scatter_add_(1, index, weight)
