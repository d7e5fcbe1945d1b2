"""Activation functions chosen by name."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # module-level functions: modules holding them pickle
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
    "identity": identity,
}


def get_activation(name: str, argument: str = "activation") -> Callable[[torch.Tensor], torch.Tensor]:
    """Look an activation up by name; ValueError naming ``argument`` when unknown."""
    if name not in ACTIVATIONS:
        raise ValueError(f"{argument} must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]
