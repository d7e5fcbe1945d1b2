"""Wall-clock timing: median of repeats after warm-up, and token-by-token loops timed in windows;
CUDA is synchronised before every time recorded."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

WARMUP = 2  # untimed calls before the timed ones


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(function: Callable[[], object], device: torch.device, repeats: int = 7, warmup: int = WARMUP) -> float:
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


def alternating_medians(functions: list[Callable[[], object]], device: torch.device, repeats: int = 7, warmup: int = WARMUP) -> list[float]:
    """Median wall time in milliseconds of each of ``functions``, called in turn ``repeats`` times (after ``warmup``
    rounds): timed side by side, their ratio does not see a load that changes between rounds."""
    for _ in range(warmup):
        for function in functions:
            function()
    sync(device)
    times = [[] for _ in functions]
    for _ in range(repeats):
        for function, kept in zip(functions, times, strict=True):
            start = time.perf_counter()
            function()
            sync(device)
            kept.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(kept) for kept in times]


@dataclass
class TokenTimes:
    """A token loop's timing: tokens done, their total time, the per-token time in each window, and
    the step's output at each window's last token."""

    tokens: int
    total_ms: float
    windows: list[dict]  # {"from": first token, "to": last token + 1, "ms_per_token": mean over the window}
    outputs: list[torch.Tensor]


def time_tokens(step: Callable[[int], torch.Tensor], count: int, device: torch.device, max_seconds: float | None = None) -> TokenTimes:
    """Call ``step(t)`` for t = 0 ... count - 1, timed in windows that double ([0, 1), [1, 2), [2, 4), ...).

    With ``max_seconds``, stops after the first token that ends past it (the last window then ends there).
    """
    windows, outputs = [], []
    start = window_start = time.perf_counter()
    first, end = 0, 1
    for t in range(count):
        output = step(t)
        over = max_seconds is not None and time.perf_counter() - start > max_seconds
        if t + 1 == end or t + 1 == count or over:
            sync(device)
            now = time.perf_counter()
            windows.append({"from": first, "to": t + 1, "ms_per_token": (now - window_start) * 1e3 / (t + 1 - first)})
            outputs.append(output)
            first, end, window_start = t + 1, 2 * end, now
            if over:
                break
    return TokenTimes(first, (window_start - start) * 1e3, windows, outputs)
