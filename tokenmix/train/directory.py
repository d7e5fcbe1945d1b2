"""Writing run directories: one run per directory, resumed truthfully, never silently replaced.

A run directory holds ``checkpoint.pt``, ``metrics.jsonl``, ``model/`` and, for text, ``tokenizer.json``
(``runs/layout.py``; ``tokenmix.runs`` reads them). Starting a run where
one exists is refused unless asked to ``overwrite`` it (which removes those files first) or to
resume it. A resume keeps every setting of the run except the ones that only say how long to
train or how to watch it (``RESUMABLE``); changing any other is refused with both values named.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..data.tokenizer import TOKENIZER_FILE
from ..fields import check_writable
from ..io.files import append_line, remove_stale_temporaries, write_text_atomic
from ..runs.layout import CHECKPOINT_FILE, LOG_RUNS_FILE, METRICS_FILE, MODEL_DIRECTORY, TENSORBOARD_DIRECTORY
from ..runs.metrics import read_metrics
from ..runs.sharded import SHARDS_DIRECTORY, remove_unused_shards

RUN_FILES = (CHECKPOINT_FILE, SHARDS_DIRECTORY, METRICS_FILE, MODEL_DIRECTORY, TOKENIZER_FILE, TENSORBOARD_DIRECTORY, LOG_RUNS_FILE)
STARTED_FILES = (METRICS_FILE, TOKENIZER_FILE, TENSORBOARD_DIRECTORY, LOG_RUNS_FILE)  # what a run has before its first checkpoint
# Settings a resume may change: how long to train, how to watch and save the run, where it lives and how its work is
# spread over processes, compiled or run (kernels). The precision is kept: a run resumed in another would not continue it exactly.
RESUMABLE = (
    "steps", "minutes", "eval_every", "eval_tokens", "final_eval_tokens", "save_every", "log", "threads", "device", "check_finite", "out",
    "context_parallel", "fsdp", "activation_checkpointing", "compile", "kernels", "collective_timeout",
)  # fmt: skip


def existing_run_files(out: Path) -> list[str]:
    return [name for name in RUN_FILES if (out / name).exists()]


def check_run_folder(out: Path) -> None:
    """ValueError unless ``out`` is a folder this process can write, or can create."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a folder for the run")
    check_writable(out, f"--out {str(out)!r}")


def check_directory(out: Path, overwrite: bool) -> None:
    """ValueError if ``out`` is a file, or holds a run and ``overwrite`` is False (read only: every rank may ask)."""
    check_run_folder(out)
    found = existing_run_files(out)
    if found and not overwrite:
        raise ValueError(
            f"--out {str(out)!r} already holds a run ({', '.join(found)}): continue it with --resume, "
            "replace it with --overwrite, or choose another --out"
        )


def claim_directory(out: Path, overwrite: bool) -> list[Path]:
    """Make ``out`` ready for a new run (``check_directory`` first); returns stale temporary files it removed."""
    check_directory(out, overwrite)
    for name in existing_run_files(out):
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return clean_stale(out)


def clean_stale(out: Path, shards: str | None = None) -> list[Path]:
    """Remove what a killed save left: temporary files (``checkpoint.pt.tmp``, ``model/*.tmp``) and shard
    folders but the checkpoint's ``shards``."""
    return remove_stale_temporaries(out) + remove_stale_temporaries(out / MODEL_DIRECTORY) + remove_unused_shards(out, shards)


def resume_changes(saved: dict, requested: dict, step: int) -> dict[str, list]:
    """The settings a resume changes, as {field: [checkpoint value, new value]}.

    ValueError naming every refused field with both values, or a run length that ends before ``step``.
    """
    changes = {key: [saved.get(key), value] for key, value in requested.items() if saved.get(key) != value}
    refused = {key: pair for key, pair in changes.items() if key not in RESUMABLE}
    if refused:
        listed = "; ".join(f"{key}: checkpoint {old!r}, given {new!r}" for key, (old, new) in sorted(refused.items()))
        raise ValueError(
            f"--resume continues the run as it was set up, but these settings differ from its checkpoint: {listed}. "
            f"A resume may change only {', '.join(RESUMABLE)}; start a new run (another --out, or --overwrite) to change the others"
        )
    if requested.get("steps") is not None and requested["steps"] < step:
        raise ValueError(f"--steps {requested['steps']} ends before the checkpoint's step {step}: give --steps > {step} to train further")
    if "minutes" in changes and saved.get("minutes") is not None and requested.get("minutes") is not None:
        if requested["minutes"] < saved["minutes"]:
            raise ValueError(f"--minutes {requested['minutes']} is shorter than the run's {saved['minutes']}: a resume may only extend it")
    return changes


def append_metrics(out: Path, record: dict) -> None:
    """One record (a JSON line) at the end of the run's ``metrics.jsonl``."""
    append_line(out / METRICS_FILE, json.dumps(record))


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the records of steps <= ``step`` (the checkpoint's), without the old final record; returns how many went.

    A run killed after its last save logged steps the resumed run will log again: each step is kept once.
    """
    if not path.is_file():
        return 0
    records = read_metrics(path)
    kept = [record for record in records if record.get("step", 0) <= step and not record.get("final")]
    text = "".join(json.dumps(record) + "\n" for record in kept)
    if path.read_text() != text:  # also drops a torn last line
        write_text_atomic(path, text)
    return len(records) - len(kept)
