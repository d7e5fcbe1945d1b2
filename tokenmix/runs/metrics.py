"""A run's ``metrics.jsonl``: one JSON record a line (steps, validation, events), the last a session's final record."""

from __future__ import annotations

import json
from pathlib import Path

from .layout import METRICS_FILE


def read_metrics(path: Path) -> list[dict]:
    """The records (JSON objects, one per line) of a ``metrics.jsonl``.

    A last line cut short by a kill (the start of a record) is dropped; any other line that is not
    a JSON object is a ValueError naming the file and the line.
    """
    if not path.is_file():
        return []
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{str(path)!r} is not a readable metrics log (JSON lines): {error}") from None
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and line.startswith("{"):
                continue  # torn by a kill during the write
            raise ValueError(f"{str(path)!r} line {number} is not a JSON record: {line[:80]!r}") from None
        if not isinstance(record, dict) or not isinstance(record.get("step", 0), int) or isinstance(record.get("step"), bool):
            raise ValueError(f"{str(path)!r} line {number} is not a metrics record (a JSON object with an integer step): {line[:80]!r}")
        records.append(record)
    return records


TRAINING_COST = ("step", "seconds_per_step", "session_minutes", "peak_memory_gb", "estimated_peak_gb")


def training_cost(run: Path) -> dict:
    """``step`` (the step it ended at), ``seconds_per_step``, ``session_minutes``, ``peak_memory_gb`` and
    ``estimated_peak_gb`` of the last training session of ``run`` (its final record), or {} when it has none (a
    run still training, or trained before they were recorded)."""
    finals = [record for record in read_metrics(run / METRICS_FILE) if record.get("final")]
    cost = {key: finals[-1][key] for key in TRAINING_COST if finals and key in finals[-1]}
    return {key: value for key, value in cost.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
