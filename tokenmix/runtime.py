"""Process-wide CPU settings: torch's thread count, and keeping freed large blocks in the heap for reuse (glibc).

glibc serves every allocation above its mmap threshold (at most 32 MB by default) with a fresh
``mmap`` and returns it on free, so each large temporary of a long-sequence step is page-faulted in
again: on 2 CPU cores that costs more than the FFTs (docs/results/speed.md, "Keeping freed memory").
Raising the mmap and trim thresholds makes freed blocks reusable. The price: the process keeps
its peak heap instead of returning it to the system. The CLI turns this on for every command;
set ``TOKENMIX_RETAIN_FREED_MEMORY=0`` to keep the default allocator behaviour.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
import warnings
from collections.abc import Iterable

import torch

ENVIRONMENT_VARIABLE = "TOKENMIX_RETAIN_FREED_MEMORY"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_LARGEST_HEAP_BLOCK = 1 << 30


def retain_freed_memory() -> bool:
    """Apply the setting once per process; True when it took effect (Linux with glibc, not disabled)."""
    if os.environ.get(ENVIRONMENT_VARIABLE, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _LARGEST_HEAP_BLOCK)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def release_freed_memory() -> None:
    """Hand the heap's free memory back to the system now (glibc ``malloc_trim``; elsewhere nothing):
    a process that kept freed blocks for reuse leaves room for others between two phases of work."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        return


def usable_cpus(pid: int = 0) -> set[int]:
    """The CPUs process ``pid`` (0: this one) may run on (its affinity mask; all ``os.cpu_count()`` where there is none)."""
    try:
        return os.sched_getaffinity(pid)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def available_cpus() -> int:
    """How many CPUs this process may run on."""
    return len(usable_cpus())


def pin_process(cpus: Iterable[int]) -> None:
    """Run every thread of this process, and the threads and processes it starts later, on ``cpus`` (Linux)."""
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("pinning to CPUs needs Linux (os.sched_setaffinity)")
    for thread in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.sched_setaffinity(int(thread), cpus)


@contextlib.contextmanager
def pinned(cpus: Iterable[int] | None):
    """``pin_process(cpus)`` for the block, then the CPUs it had; nothing where ``cpus`` is None."""
    if cpus is None:
        yield
        return
    before = usable_cpus()
    pin_process(cpus)
    try:
        yield
    finally:
        pin_process(before)


@contextlib.contextmanager
def threads_within(threads: int | None):
    """torch's intra-op threads set to ``threads`` inside the block, the earlier count after (None: unchanged)."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def set_threads(threads: int) -> None:
    """``torch.set_num_threads``, with a warning when ``threads`` exceeds the CPUs this process may use:
    threads beyond them take turns on the same cores and slow every operation down."""
    cpus = available_cpus()
    if threads > cpus:
        warnings.warn(f"--threads {threads} exceeds the {cpus} CPUs this process may use: the extra threads slow it down", stacklevel=2)
    torch.set_num_threads(threads)
