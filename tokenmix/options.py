"""Keyword options of mixers, blocks and models: every default resolved, unknown names refused.

A model is rebuilt from its saved options alone, so the options must be complete: a default that
changes in a later version must not change a saved model. ``take_options`` reads a constructor's
keyword parameters from its signature; classes that forward ``**options`` to a part (a block to
its mixer) resolve that part's options too, so the result names every argument of every part.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

from .fields import check_settings

POSITIONAL = ("self", "dim", "causal")  # given by the caller, never options


# The annotations a given option's value is checked against (a union of these, written "int | None"); others are
# checked by the constructor itself.
_SIMPLE_TYPES = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,), "None": (type(None),)}


def check_option_type(name: str, value, annotation) -> None:
    """ValueError unless ``value`` fits ``annotation`` when it is a union of bool, int, float, str and None
    (a bool is not a number here: ``causal="no"`` or ``decay=True`` are refused, not read as truthy)."""
    parts = [part.strip() for part in annotation.split("|")] if isinstance(annotation, str) else []
    if not parts or any(part not in _SIMPLE_TYPES for part in parts):
        return
    accepted = [kind for part in parts for kind in _SIMPLE_TYPES[part]]
    fits = any(isinstance(value, kind) and (kind is bool or not isinstance(value, bool)) for kind in accepted)
    if not fits:
        raise ValueError(f"option {name} must be {' or '.join(parts)}, got {value!r} ({type(value).__name__})")


def take_options(function: Callable, options: dict, skip: Iterable[str] = POSITIONAL) -> tuple[dict, dict]:
    """(own, rest): ``function``'s keyword arguments, taken from ``options`` (type-checked against the
    annotation, ``check_option_type``) or else its defaults, and the options it does not take (to be
    forwarded, or refused)."""
    own, rest = {}, dict(options)
    for name, parameter in inspect.signature(function).parameters.items():
        if name in skip or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL, parameter.POSITIONAL_ONLY):
            continue
        if name in rest:
            own[name] = rest.pop(name)
            check_option_type(name, own[name], parameter.annotation)
        elif parameter.default is not parameter.empty:
            own[name] = parameter.default
    return own, rest


def merge_options(own: dict, part: dict, owner: str, shared: Iterable[str] = ()) -> dict:
    """A block's own options and those of a part it builds, in one flat namespace.

    A name both take could not be set apart, so it is refused (a design error, caught by the
    contract tests) unless listed in ``shared``: then the block passes its value on to the part.
    """
    clash = (set(own) & set(part)) - set(shared)
    if clash:
        raise ValueError(f"{owner} and the part it builds both take the options {sorted(clash)}: rename one of them")
    return {**part, **own}


def refuse_unknown(unknown: dict, accepted: Iterable[str], owner: str) -> None:
    """ValueError naming the unknown options and every accepted one."""
    if unknown:
        names = ", ".join(repr(name) for name in sorted(unknown))
        plural = "s" if len(unknown) > 1 else ""
        raise ValueError(f"unknown option{plural} {names} for {owner}; accepted options: {', '.join(sorted(accepted))}")


@dataclass
class Options:
    """Base of a mixer's options: a dataclass whose fields are declared with ``fields.setting(default,
    kind, help)``, so each option's type, range, default and one-line help live in one place. The
    kinds check every value on construction (a ValueError naming the option); the option table of
    docs/options.md is printed from the fields (``python -m tokenmix.mixers.options_page``)."""

    def __post_init__(self):
        check_settings(self)

    @classmethod
    def take(cls, options: dict) -> tuple[Options, dict]:
        """(own, rest): this dataclass from those of ``options`` it declares (defaults for the others), and the rest."""
        names = {spec.name for spec in fields(cls)}
        own = cls(**{key: value for key, value in options.items() if key in names})
        return own, {key: value for key, value in options.items() if key not in names}

    def pinned(self, dim: int) -> Options:
        """Defaults derived from the width (a None that stands for a number) replaced by that number, so a
        saved config does not depend on how they are derived; the others as they are."""
        return self

    def as_dict(self) -> dict:
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}


class Configurable:
    """Mixin: ``resolve_options(options, dim) -> (resolved, unknown)`` from the constructor's signature.

    Subclasses override it to add the resolved options of a part they forward ``**options`` to, and
    to pin defaults computed from other values (a None that means "derived from dim") to the value
    they stand for, so that a saved config does not depend on how the default is derived.
    """

    @classmethod
    def resolve_options(cls, options: dict, dim: int) -> tuple[dict, dict]:
        return take_options(cls.__init__, options)
