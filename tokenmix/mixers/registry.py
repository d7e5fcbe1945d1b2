"""Name -> mixer class registry (the public ``build_mixer`` / ``list_mixers``)."""

from __future__ import annotations

from torch import nn

from ..options import Options, refuse_unknown
from ..registry import Registry

_MIXERS: Registry[type] = Registry("mixer name")


def register_mixer(name: str):
    """Class decorator adding a mixer under ``name``."""
    return lambda cls: _MIXERS.add(name, cls)


def list_mixers() -> list[str]:
    return _MIXERS.names()


def mixer_class(name: str):
    return _MIXERS[name]


def resolve_mixer(name: str, options: dict, dim: int) -> Options:
    """The options of mixer ``name`` at ``dim`` channels from flat, dotted or nested ``options``, every default
    filled in (``Configurable.resolve_options``); ValueError on unknown names."""
    resolved, unknown = mixer_class(name).resolve_options(options, dim)
    refuse_unknown(unknown, resolved.as_dict(), f"mixer {name!r}")
    return resolved


def resolve_mixer_options(name: str, options: dict, dim: int) -> dict:
    """Every constructor option of mixer ``name`` at ``dim`` channels, defaults filled in, as a saved config holds them."""
    return resolve_mixer(name, options, dim).as_dict()


def build_mixer(name: str, dim: int, causal: bool = False, **options) -> nn.Module:
    """Build a registered mixer: (batch, length, dim) -> (batch, length, dim)."""
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    return mixer_class(name)(dim, causal, resolve_mixer(name, options, dim))
