"""Measuring a bench run's cases one after another, and the tables printed for its records.

On CPU each case runs in a fresh process (``worker``: clean peak-RSS accounting); on CUDA in this
one, with the allocator keeping freed blocks (``runtime.retain_freed_memory``), a failing case (out
of memory) recorded with its error. ``keep(records)`` runs after every case, so an interrupted run
has every finished case on disk.
"""

from __future__ import annotations

import torch

from ..io.progress import progress_bar
from ..io.table import format_table
from ..runtime import retain_freed_memory
from .cases import Case
from .data import DATA_KINDS, data_tables
from .measure import measure
from .pathfinder import PATHFINDER_KINDS, pathfinder_tables
from .records import failed_measurement
from .report import sections, table_columns
from .scale import SCALE_KINDS, scale_tables
from .serve import SERVE_KINDS, serve_tables
from .worker import run_in_subprocess


def measure_cases(cases: list[Case], repeats: int, threads: int, profile: bool, revision: str | None, keep) -> list[dict]:
    """The records of ``cases`` (all on one device), each stamped with the source ``revision``."""
    in_process = bool(cases) and torch.device(cases[0].device).type == "cuda"
    allocator = retain_freed_memory() if in_process else None
    records = []
    for case in progress_bar(cases, desc="bench", unit="case"):
        if in_process:
            try:
                measurement = measure(case, repeats, profile=profile)
            except RuntimeError as error:  # e.g. CUDA out of memory: keep the other cases
                measurement = failed_measurement(case, f"{type(error).__name__}: {error}")
            measurement.retain_freed_memory = allocator
        else:
            measurement = run_in_subprocess(case, repeats, threads, profile)
        measurement.git_commit = revision
        records.append(measurement.to_dict())
        keep(records)
    return records


def bench_tables(records: list[dict]) -> str:
    """The tables ``tokenmix bench`` prints for its records (those it writes with --output)."""
    if records and records[0].get("kind") in SCALE_KINDS:
        return scale_tables(records)
    if records and records[0].get("kind") in SERVE_KINDS:
        return serve_tables(records)
    if records and records[0].get("kind") in DATA_KINDS:
        return data_tables(records)
    if records and records[0].get("kind") in PATHFINDER_KINDS:
        return pathfinder_tables(records)
    return "\n\n".join(format_table(rows, table_columns(rows)) for rows in sections(records))
