"""The settings of a server, typed and checked once: ``EngineConfig`` (what the scheduler and the model
runner need) inside ``ServeConfig`` (what the engine's process needs to load and run the model). Plain
data: it crosses the process boundary pickled and round-trips through JSON (``as_dict`` / ``from_dict``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..devices import resolve_device
from ..fields import Integer
from ..generation.graphs import check_decoding
from ..ops.fused_toeplitz import KERNELS, check_fused_device
from ..precision import PRECISIONS


@dataclass(frozen=True)
class EngineConfig:
    """``context``: the longest stream (prompt, padding and completion) a row may reach; every state is
    made for it, so a request's tokens are those of ``tokenmix.generate(..., max_length=context)``.
    ``max_batch``: rows at most (choices of running and reading requests); ``max_state_memory``: bytes
    the states and the prefix cache may hold; ``chunk``: prompt tokens a prefill reads per iteration;
    ``prefix_min``: prompts at least this long are cached for reuse (0: no cache); ``prefix_entries``:
    prompts cached at most; ``prefill_threads``: torch's threads while a prefill reads its chunk (None:
    those of the steps); ``decoding``: how batches step (``tokenmix.generate``'s: "static" buffers, replayed as
    a CUDA graph per batch on CUDA, "stream", or "auto")."""

    context: int
    max_batch: int
    max_state_memory: int
    chunk: int = 512
    prefix_min: int = 64
    prefix_entries: int = 16
    prefill_threads: int | None = None
    decoding: str = "auto"

    def __post_init__(self):
        for name, kind in (("context", Integer(1)), ("max_batch", Integer(1)), ("max_state_memory", Integer(1)), ("chunk", Integer(1))):
            kind.check(getattr(self, name), name)
        Integer(0).check(self.prefix_min, "prefix_min")
        Integer(1).check(self.prefix_entries, "prefix_entries")
        Integer(1, optional=True).check(self.prefill_threads, "prefill_threads")
        check_decoding(self.decoding)


@dataclass(frozen=True)
class ServeConfig:
    """What the engine's process serves: the model at ``served`` (a run directory, checkpoint or export) on
    ``device`` under ``precision`` with ``threads`` torch threads, scheduled by ``engine``, its Toeplitz mixers on
    ``kernels`` (``ops.fused_toeplitz.kernels``)."""

    served: str
    device: str
    precision: str
    threads: int
    engine: EngineConfig
    kernels: str = "auto"

    def __post_init__(self):
        if not isinstance(self.served, str) or not isinstance(self.device, str):
            raise ValueError(f"served and device must be strings, got {self.served!r} and {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        Integer(1).check(self.threads, "threads")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {list(KERNELS)}, got {self.kernels!r}")
        if self.kernels == "fused":
            check_fused_device(resolve_device(self.device))
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"engine must be an EngineConfig, got {type(self.engine).__name__}")

    def as_dict(self) -> dict:
        """JSON-able plain data (``from_dict`` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ServeConfig:
        return cls(**{**data, "engine": EngineConfig(**data["engine"])})
