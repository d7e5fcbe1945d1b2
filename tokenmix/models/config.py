"""Model configuration: every resolved option, a format version, a JSON round trip.

A config names the model, its task and sizes, and *every* constructor option of its blocks and
mixers with defaults filled in (``resolve_model_options``), so a saved model reloads as the same
model after a default changes. Configs of format 2 and later are read strictly: an unknown or
missing key, or a newer format, is a ValueError. ``from_dict`` reads today's format; a config of an
older one is brought to it first by ``tokenmix.runs.migrations`` (one function per format), which every
reader of saved files goes through.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, fields

from ..options import Options
from ..validation import check_int
from ..version import __version__
from .registry import TASKS, model_spec, resolve_model

FORMAT_VERSION = 5
POOLS = ("mean", "first", "last")
# The keys of each format (format 1 recorded no versions; format 3 added the classification head's pool and documents;
# formats 4 and 5 changed options, not keys: runs/migrations.py).
FORMAT_KEYS = {1: {"name", "task", "vocab_size", "dim", "depth", "num_classes", "options"}}
FORMAT_KEYS[2] = FORMAT_KEYS[1] | {"format_version", "tokenmix_version"}
FORMAT_KEYS[3] = FORMAT_KEYS[2] | {"pool", "documents"}
FORMAT_KEYS[4] = FORMAT_KEYS[3]
FORMAT_KEYS[5] = FORMAT_KEYS[4]


@dataclass
class ModelConfig:
    """Everything needed to rebuild a model. ``options`` are resolved on construction: given as a dict
    (flat, dotted or nested names, ``resolve_model``) or as the resolved tree itself, they are held as the
    tree (an ``Options`` of the model's blocks).

    Classification heads: ``pool`` reduces the final hidden states over real tokens ("mean", or
    the first or last real token's); ``documents=2`` is the Long Range Arena dual encoder (two
    documents per example through the same blocks, classified from [u, v, u*v, u-v]).
    """

    name: str
    task: str = "lm"
    vocab_size: int = 256
    dim: int = 256
    depth: int = 4
    num_classes: int | None = None
    options: Options | dict = field(default_factory=dict)
    pool: str = "mean"
    documents: int = 1
    format_version: int = field(default=FORMAT_VERSION, compare=False)
    tokenmix_version: str = field(default=__version__, compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a model name (a string), got {self.name!r}")
        if not isinstance(self.task, str) or self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        for argument in ("vocab_size", "dim", "depth"):
            check_int(getattr(self, argument), argument)
        if self.task == "classify":
            check_int(self.num_classes, "num_classes (task='classify'; 1 is one regressed score)", minimum=1)
        elif self.num_classes is not None:
            raise ValueError(f"num_classes is only used with task='classify', got {self.num_classes!r}")
        if not isinstance(self.pool, str) or self.pool not in POOLS:
            raise ValueError(f"pool must be one of {list(POOLS)}, got {self.pool!r}")
        check_int(self.documents, "documents", maximum=2)
        if self.task != "classify" and (self.pool, self.documents) != ("mean", 1):
            raise ValueError(f"pool and documents shape a classification head; task={self.task!r} has none")
        self.options = self._resolved_options()
        self.format_version, self.tokenmix_version = FORMAT_VERSION, __version__

    @property
    def causal(self) -> bool:
        return self.task == "lm"

    def _resolved_options(self) -> Options:
        """The options as the model's tree: resolved from a dict, or a copy of the tree given."""
        if isinstance(self.options, dict):
            return resolve_model(self.name, self.options, self.dim, self.depth)
        if type(self.options) is not model_spec(self.name).layers.options_type:
            raise ValueError(f"options must be a dict of option names to values, got {type(self.options).__name__}")
        return copy.deepcopy(self.options)

    def to_dict(self) -> dict:
        """The saved form, the options nested as ``Options.as_dict`` writes them (the other fields are plain values)."""
        return {spec.name: getattr(self, spec.name) for spec in fields(self)} | {"options": self.options.as_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """Read a saved config of today's format; ValueError on another format or keys it does not have
        (``tokenmix.runs.migrations.read_model_config`` reads older formats)."""
        version = config_format(data)
        if version != FORMAT_VERSION:
            raise ValueError(
                f"config format_version {version} predates this tokenmix's ({FORMAT_VERSION}): read saved configs with "
                "tokenmix.runs.migrations.read_model_config, which upgrades them"
            )
        return cls(**{key: value for key, value in data.items() if key not in ("format_version", "tokenmix_version")})


def config_format(data: dict) -> int:
    """The format of a saved config, checked: ValueError on a newer format, or keys its format does not have."""
    if not isinstance(data, dict):
        raise ValueError(f"a model config must be a JSON object, got {type(data).__name__}")
    version = data.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        written = data.get("tokenmix_version", "unknown")
        raise ValueError(
            f"config format_version {version!r} (written by tokenmix {written}) is not one this tokenmix "
            f"({__version__}, formats 1 to {FORMAT_VERSION}) reads: a newer tokenmix wrote it, or the file is damaged"
        )
    known = FORMAT_KEYS[version]
    unknown = sorted(map(str, set(data) - known))
    if unknown:
        raise ValueError(f"config has unknown keys {unknown}; format {version} configs have {sorted(known)}")
    missing = sorted(known - set(data)) if version > 1 else [] if "name" in data else ["name"]
    if missing:
        raise ValueError(f"config lacks {missing}: a format {version} config records every field ({sorted(known)})")
    if not isinstance(data.get("tokenmix_version", ""), str):
        raise ValueError(f"config tokenmix_version must be a version string, got {data['tokenmix_version']!r}")
    return version
