"""Name -> mixer constructor registry (the public ``build_mixer`` / ``list_mixers``)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

_MIXERS: dict[str, Callable[..., nn.Module]] = {}


def register_mixer(name: str):
    """Class decorator adding a mixer under ``name``."""

    def add(constructor):
        if name in _MIXERS:
            raise ValueError(f"mixer {name!r} is already registered")
        _MIXERS[name] = constructor
        return constructor

    return add


def list_mixers() -> list[str]:
    return sorted(_MIXERS)


def mixer_class(name: str):
    if name not in _MIXERS:
        raise ValueError(f"mixer name must be one of {list_mixers()}, got {name!r}")
    return _MIXERS[name]


def build_mixer(name: str, dim: int, causal: bool = False, **options) -> nn.Module:
    """Build a registered mixer: (batch, length, dim) -> (batch, length, dim)."""
    constructor = mixer_class(name)
    try:
        return constructor(dim, causal, **options)
    except TypeError as error:  # unknown keyword option
        raise ValueError(f"bad options for mixer {name!r}: {error}") from None
