"""Which contiguous part of a sequence each process of a context-parallel group holds."""

from __future__ import annotations

import functools
from dataclasses import dataclass


def shard_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of ``parts`` contiguous shards of ``length`` items, the first ``length % parts`` one longer."""
    size, extra = divmod(length, parts)
    starts = [index * size + min(index, extra) for index in range(parts + 1)]
    return list(zip(starts[:-1], starts[1:], strict=True))


@dataclass(frozen=True)
class ContextShard:
    """Process ``rank`` of the ``size`` processes of ``group`` holds tokens [start, stop) of sequences of ``length``."""

    group: object  # a torch.distributed ProcessGroup
    rank: int
    size: int
    length: int

    @functools.cached_property
    def bounds(self) -> list[tuple[int, int]]:
        """Every process's [start, stop), in rank order."""
        return shard_bounds(self.length, self.size)

    @property
    def start(self) -> int:
        return self.bounds[self.rank][0]

    @property
    def stop(self) -> int:
        return self.bounds[self.rank][1]
