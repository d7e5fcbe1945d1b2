"""``tokenmix compare``'s work: two ``tokenmix bench --output`` files read and checked, their shared cases matched,
and the speed-ups between them with the measuring conditions that changed."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from ..io.table import format_table
from .cases import CASE_KINDS, TRAINING_KINDS
from .report import measured

COMPARED_SETTINGS = ("dim", "batch", "dtype", "device")  # must agree where both records have them
CONDITIONS = ("threads", "device", "dtype", "torch", "retain_freed_memory")  # what a speed-up depends on besides the code


def condition_differences(before: list[dict], after: list[dict]) -> list[str]:
    """A line per measuring condition on which the two runs differ (thread count, device, dtype, torch
    version, allocator setting): a speed-up between them mixes that change with the code's."""

    def values(records: list[dict], field: str) -> str:
        return ", ".join(sorted({str(record.get(field)) for record in records if field in record})) or "not recorded"

    lines = []
    for field in CONDITIONS:
        old, new = values(before, field), values(after, field)
        if old != new:
            lines.append(f"{field} differs: before {old}; after {new}")
    return lines


def comparison_rows(before: list[dict], after: list[dict]) -> list[dict]:
    """Records measured in both runs, matched by (kind, mixer, causal, length) and agreeing on
    ``COMPARED_SETTINGS`` (a --quick run is not compared with a full one), with speed-ups."""
    key = lambda record: (record.get("kind", "mixer"), record["mixer"], record["causal"], record["length"])  # noqa: E731
    earlier = {key(record): record for record in measured(before)}
    rows = []
    for record in measured(after):
        old = earlier.get(key(record))
        if old is None or any(field in old and field in record and old[field] != record[field] for field in COMPARED_SETTINGS):
            continue
        rows.append(
            {
                "kind": key(record)[0],
                "mixer": record["mixer"],
                "causal": record["causal"],
                "length": record["length"],
                "forward_ms_before": old["forward_ms"],
                "forward_ms_after": record["forward_ms"],
                "forward_speedup": old["forward_ms"] / record["forward_ms"],
                "forward_backward_ms_before": old["forward_backward_ms"],
                "forward_backward_ms_after": record["forward_backward_ms"],
                "forward_backward_speedup": old["forward_backward_ms"] / record["forward_backward_ms"],
            }
        )
    return rows


def read_records(path: str) -> list[dict]:
    """The measurement records of a ``tokenmix bench --output`` file; ValueError for anything else."""
    try:
        records = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path!r} is not a readable bench JSON file: {error}") from None
    required = {"mixer", "causal", "length", "forward_ms", "forward_backward_ms"}  # "kind" came later: default "mixer"
    if isinstance(records, list):  # only the training kinds are compared (not decoding, not precision)
        records = [r for r in records if not (isinstance(r, dict) and r.get("kind") in CASE_KINDS and r["kind"] not in TRAINING_KINDS)]
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) and required <= set(r) for r in records):
        raise ValueError(f"{path!r} is not a `tokenmix bench --output` file: expected a list of records with {sorted(required)}")
    for number, record in enumerate(records):
        problem = _record_problem(record)
        if problem:
            raise ValueError(f"{path!r}: record {number} ({record.get('mixer')!r:.40} at length {record.get('length')!r:.20}) {problem}")
    return records


SETTING_KINDS = {"dim": int, "batch": int, "threads": int, "retain_freed_memory": bool}  # the others are strings


def _record_problem(record: dict) -> str | None:
    """What is wrong with a bench record's identity, settings or times (None: nothing)."""
    integer = lambda value: isinstance(value, int) and not isinstance(value, bool) and value > 0  # noqa: E731
    if not isinstance(record.get("kind", "mixer"), str) or not isinstance(record["mixer"], str):
        return "has a kind or name that is not a string"
    if not isinstance(record["causal"], bool) or not integer(record["length"]):
        return "must have a causal flag (true or false) and a length > 0"
    for key in (*COMPARED_SETTINGS, *CONDITIONS):
        kind = SETTING_KINDS.get(key, str)
        if record.get(key) is not None and not (isinstance(record[key], kind) and (kind is bool or not isinstance(record[key], bool))):
            return f"has {key} {record[key]!r:.30}, not a {kind.__name__}"
    if record.get("error") is not None and not isinstance(record["error"], str):
        return "has an error that is not a string"
    times = [record[field] for field in ("forward_ms", "forward_backward_ms")]
    positive = lambda time: isinstance(time, (int, float)) and not isinstance(time, bool) and 0 < time < math.inf  # noqa: E731
    if not record.get("error") and not all(map(positive, times)):
        return f"has times {times}, not positive numbers"
    return None


def comparison_table(before_path: str, after_path: str) -> str:
    """What ``tokenmix compare`` prints: the speed-ups of the cases two bench files share."""
    before, after = read_records(before_path), read_records(after_path)
    rows = comparison_rows(before, after)
    if not rows:
        raise ValueError(
            "the two files share no comparable case: the same kind, name, direction and length, measured at the same "
            "dim, batch, dtype and device"
        )
    for line in condition_differences(before, after):
        warnings.warn(f"{line}: the speed-ups mix this change with the code's", stacklevel=2)
    return format_table(rows, list(rows[0]))
