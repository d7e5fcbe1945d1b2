"""Wall-clock timing: median of repeats after warm-up, synchronising CUDA around each call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(function: Callable[[], object], device: torch.device, repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``function()`` in milliseconds."""
    for _ in range(warmup):
        function()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
