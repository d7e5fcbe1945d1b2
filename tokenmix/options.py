"""Options of mixers and blocks, declared as dataclasses: every default resolved, unknown names refused.

A model is rebuilt from its saved options alone, so the options must be complete: a default that
changes in a later version must not change a saved model. Each mixer and block declares its own
options in an ``Options`` dataclass; the mixers a block builds (its parts, ``mixers/parts.py``) hold
theirs in its ``parts``, so one resolved ``Options`` is the typed tree of a whole block:

    TnnOptions(expand=3, ..., parts={"mixer": MixerChoice("tno", TnoOptions(rpe_dim=64, ...))})

A saved config holds it as a dict (``as_dict``), each part nested under its key with its mixer's name.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

from .fields import Number, check_settings, setting, setting_fields


def dropout_setting():
    """The ``dropout`` field every block declares."""
    return setting(0.0, Number(0, 1), "dropout probability in the block (its attention's too, where it has one)")


def refuse_unknown(unknown: dict, accepted: Iterable[str], owner: str) -> None:
    """ValueError naming the unknown options and every accepted one."""
    if unknown:
        names = ", ".join(repr(name) for name in sorted(unknown))
        plural = "s" if len(unknown) > 1 else ""
        raise ValueError(f"unknown option{plural} {names} for {owner}; accepted options: {', '.join(sorted(accepted))}")


@dataclass
class MixerChoice:
    """A part of a block or mixer: the registered mixer it builds, by ``name``, with that mixer's ``options``.
    Read by key as its saved dict is: ``choice["name"]``, ``choice["rpe_dim"]``."""

    name: str
    options: Options

    def __contains__(self, key: str) -> bool:
        return key == "name" or key in self.options

    def __getitem__(self, key: str):
        return self.name if key == "name" else self.options[key]

    def as_dict(self) -> dict:
        return {"name": self.name, **self.options.as_dict()}


@dataclass
class Options:
    """Base of a mixer's or block's options: a dataclass whose fields are declared with ``fields.setting(default,
    kind, help)``, so each option's type, range, default and one-line help live in one place. The
    kinds check every value on construction (a ValueError naming the option); the option table of
    docs/options.md is printed from the fields (``python docs/options_page.py``).

    ``parts``: the mixers it builds, by the key of each part (``Configurable.parts``), filled in when the
    options are resolved. Options are read and set by name too, as a saved config's dict holds them:
    ``options["segment_length"]``, ``options["mixer"]["rpe_dim"]`` (a setting set so is checked by its kind).
    """

    parts: dict[str, MixerChoice] = field(default_factory=dict, kw_only=True)

    def __post_init__(self):
        check_settings(self)

    @classmethod
    def take(cls, options: dict) -> tuple[Options, dict]:
        """(own, rest): this dataclass from those of ``options`` it declares (defaults for the others), and the rest."""
        names = {spec.name for spec in setting_fields(cls)}
        own = cls(**{key: value for key, value in options.items() if key in names})
        return own, {key: value for key, value in options.items() if key not in names}

    def pinned(self, dim: int) -> Options:
        """Defaults derived from the width (a None that stands for a number) replaced by that number, so a
        saved config does not depend on how they are derived; the others as they are."""
        return self

    def as_dict(self) -> dict:
        """The saved form: every setting, then each part as ``{"name": mixer, **its options}``."""
        own = {spec.name: copy.deepcopy(getattr(self, spec.name)) for spec in setting_fields(self)}
        return {**own, **{key: choice.as_dict() for key, choice in self.parts.items()}}

    def __contains__(self, name: str) -> bool:
        return name in self.parts or any(spec.name == name for spec in setting_fields(self))

    def __getitem__(self, name: str):
        if name not in self:
            raise KeyError(name)
        return self.parts[name] if name in self.parts else getattr(self, name)

    def __setitem__(self, name: str, value) -> None:
        """Set the setting ``name``, checked by its kind (a part is chosen by resolving options anew)."""
        spec = next((spec for spec in setting_fields(self) if spec.name == name), None)
        if spec is None:
            raise KeyError(name)
        setattr(self, name, spec.metadata["kind"].check(value, name))

    def get(self, name: str, default=None):
        return self[name] if name in self else default
