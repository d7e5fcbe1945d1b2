"""Model names -> block constructors and their default options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..blocks import TnnBlock


@dataclass(frozen=True)
class ModelSpec:
    block: Callable[..., nn.Module]
    defaults: dict = field(default_factory=dict)
    description: str = ""


_MODELS: dict[str, ModelSpec] = {
    "tnn": ModelSpec(TnnBlock, {"mixer": "tno"}, "Toeplitz neural network (paper 002): GTU(TNO) + GLU blocks"),
}


def list_models() -> list[str]:
    return sorted(_MODELS)


def model_spec(name: str) -> ModelSpec:
    if name not in _MODELS:
        raise ValueError(f"name must be one of {list_models()}, got {name!r}")
    return _MODELS[name]
