"""Options of mixers and blocks, declared as dataclasses: every default resolved, unknown names refused.

A model is rebuilt from its saved options alone, so the options must be complete: a default that
changes in a later version must not change a saved model. Each mixer and block declares its own
options in an ``Options`` dataclass; ``mixers/parts.py`` nests those of the mixers a block builds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from .fields import Number, check_settings, setting


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
class Options:
    """Base of a mixer's or block's options: a dataclass whose fields are declared with ``fields.setting(default,
    kind, help)``, so each option's type, range, default and one-line help live in one place. The
    kinds check every value on construction (a ValueError naming the option); the option table of
    docs/options.md is printed from the fields (``python docs/options_page.py``)."""

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
