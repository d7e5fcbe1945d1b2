"""Options of mixers and blocks as a tree: each part's own options dataclass, and the mixers it builds nested.

A block's (or mixer's) ``options_type`` declares its own options (``tokenmix.options.Options``);
``parts()`` names the registered mixers it builds. Resolved (``Configurable.resolve_options``), they
are one typed tree, each part's mixer and options in the ``parts`` of its owner's, and a saved
config holds each nested under its key:

    {"dropout": 0.0, "expand": 3, ..., "mixer": {"name": "tno", "rpe_dim": 64, ...}}

Options are given flat (a name sets the owner's option and every nested part's of that name: a
block's ``dropout`` reaches its attention's), dotted (``"mixer.rpe_dim"``: one part's), or nested as
a saved config holds them; ``"mixer": "ski_tno"`` picks a part's mixer by name. They are resolved
once, where flat options come in (``build_mixer``, ``ModelConfig``); mixers and blocks are built from
the resolved tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..options import MixerChoice, Options, refuse_unknown
from .registry import mixer_class


@dataclass(frozen=True)
class Part:
    """A registered mixer its owner builds, with its options nested under ``key``.

    ``choices``: the mixers a user may pick by name (None: always ``default``); ``defaults``: the
    owner's defaults for the part's options; ``width``: the part's channels from the owner's own
    options and width (a GTU's mixer works on expand * dim channels)."""

    key: str
    default: str
    choices: Callable[[], list[str]] | None = None
    defaults: dict = field(default_factory=dict)
    width: Callable[[Options, int], int] | None = None

    def allowed(self) -> list[str]:
        return self.choices() if self.choices else [self.default]


def leaf_names(tree: dict) -> list[str]:
    """The dotted names of every option in ``tree`` (``["dropout", "mixer.name", "mixer.rpe_dim", ...]``)."""
    names = []
    for key, value in tree.items():
        names += [f"{key}.{name}" for name in leaf_names(value)] if isinstance(value, dict) else [key]
    return names


class Configurable:
    """Mixin of mixers and blocks: options from ``options_type``, nested ``parts()``, resolved once into an
    ``Options`` tree that the constructor takes (``take_options``)."""

    options_type: type[Options] = Options
    """The dataclass of its own options (``Options``): types, ranges, defaults and help of each."""

    @classmethod
    def parts(cls) -> list[Part]:
        """The registered mixers it builds (none by default)."""
        return []

    @classmethod
    def resolve_options(cls, options: dict, dim: int) -> tuple[Options, dict]:
        """(tree, unknown): its options from flat, dotted or nested ``options``, checked, defaults filled in
        and derived ones pinned (``Options.pinned``), each part's resolved in its ``parts``; and the options
        nothing took."""
        parts = {part.key: part for part in cls.parts()}
        given, flat = {key: {} for key in parts}, {}
        for key, value in options.items():
            head, dot, rest = key.partition(".")
            if dot and head in parts:
                given[head][rest] = value
            elif key in parts:
                if not isinstance(value, (str, dict)):
                    raise ValueError(f"{key} must be a mixer name or a dict of its options, got {value!r}")
                given[key].update({"name": value} if isinstance(value, str) else value)
            else:
                flat[key] = value
        own, unknown = cls.options_type.take(flat)
        own = own.pinned(dim)
        taken = set(flat) - set(unknown)
        for key, part in parts.items():
            chosen = dict(given[key])
            name = chosen.pop("name", part.default)
            if name not in part.allowed():
                raise ValueError(f"{key} must be one of {part.allowed()} (a part of {cls.__name__}), got {name!r}")
            width = part.width(own, dim) if part.width else dim
            subtree, left = mixer_class(name).resolve_options({**part.defaults, **flat, **chosen}, width)
            accepted = leaf_names(subtree.as_dict())
            refuse_unknown({option: chosen[option] for option in left if option in chosen}, accepted, f"{key} ({name})")
            taken |= set(flat) - set(left)
            own.parts[key] = MixerChoice(name, subtree)
        return own, {key: value for key, value in flat.items() if key not in taken}

    def take_options(self, options: Options | None, dim: int) -> None:
        """``self.options``: ``options`` resolved (its ``options_type``, each part in its ``parts``), or the
        defaults at ``dim`` channels when None; ValueError for options of another type or lacking a part."""
        if options is None:
            options = self.resolve_options({}, dim)[0]
        if type(options) is not self.options_type:
            raise ValueError(f"options of {type(self).__name__} must be a {self.options_type.__name__}, got {type(options).__name__}")
        missing = [part.key for part in self.parts() if part.key not in options.parts]
        if missing:
            raise ValueError(f"options of {type(self).__name__} lack the parts {missing}: resolve them (resolve_options)")
        self.options = options.pinned(dim)

    def build_part(self, key: str, width: int, causal: bool):
        """The mixer of part ``key`` with its resolved options."""
        choice = self.options.parts[key]
        return mixer_class(choice.name)(width, causal, choice.options)
