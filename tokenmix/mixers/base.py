"""The mixer contract: (batch, length, dim) -> same shape, optional padding mask."""

from __future__ import annotations

import torch
from torch import nn

from ..validation import check_int


def check_sequence(x: torch.Tensor, dim: int, mask: torch.Tensor | None) -> None:
    """ValueError unless x is (batch, length >= 1, dim) floating point and mask is bool (batch, length)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a (batch, length, dim) tensor, got {shape}")
    if x.shape[1] < 1:
        raise ValueError("x must have length >= 1")
    if x.shape[2] != dim:
        raise ValueError(f"x has {x.shape[2]} channels but the mixer was built with dim={dim}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating point tensor, got dtype {x.dtype}")
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor (True at real tokens), got dtype {mask.dtype}")
        if tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"mask must have shape (batch, length) = {tuple(x.shape[:2])}, got {tuple(mask.shape)}")


def zero_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero the padded positions so they cannot reach real tokens."""
    return x if mask is None else x.masked_fill(~mask[..., None], 0.0)


class Mixer(nn.Module):
    """Base class: validates input, zeros padding, then calls ``mix`` on (batch, length, dim)."""

    fft_based = False
    causal_modes: tuple[bool, ...] = (False, True)  # the values of ``causal`` the mixer supports

    def __init__(self, dim: int, causal: bool):
        super().__init__()
        check_int(dim, "dim")
        self.dim = dim
        self.causal = bool(causal)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        check_sequence(x, self.dim, mask)
        return self.mix(zero_padding(x, mask))

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"dim={self.dim}, causal={self.causal}"
