"""Model configuration: a dataclass with a JSON round trip."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..validation import check_int

TASKS = ("lm", "mlm", "classify")


@dataclass
class ModelConfig:
    """Everything needed to rebuild a model. ``options`` go to the blocks (mixer options included)."""

    name: str
    task: str = "lm"
    vocab_size: int = 256
    dim: int = 256
    depth: int = 4
    num_classes: int | None = None
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        for argument in ("vocab_size", "dim", "depth"):
            check_int(getattr(self, argument), argument)
        if self.task == "classify":
            check_int(self.num_classes, "num_classes (task='classify')", minimum=2)
        elif self.num_classes is not None:
            raise ValueError(f"num_classes is only used with task='classify', got {self.num_classes!r}")

    @property
    def causal(self) -> bool:
        return self.task == "lm"

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        return cls(**data)
