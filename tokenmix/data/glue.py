"""The GLUE tasks (Wang et al. 2018, arXiv 1804.07461) read as raw text from their release TSV files.

Files: one folder per task, ``SST-2``, ``CoLA``, ``MRPC``, ``QQP``, ``STS-B``, ``MNLI``, ``QNLI``,
``RTE``, each holding ``train.tsv`` and ``dev.tsv`` (MNLI: ``dev_matched.tsv`` and
``dev_mismatched.tsv``); DIR may hold the task folder or be it. The test files have no labels and
are not read.

Layouts (tab separated, UTF-8; quotes are literal characters, so no CSV quoting is applied):

- SST-2: header ``sentence, label``; labels 0 negative, 1 positive.
- CoLA: no header; columns source, label, original mark, sentence; labels 0 unacceptable, 1 acceptable.
- MRPC: header ``Quality, #1 ID, #2 ID, #1 String, #2 String``; label = Quality, 0 not_equivalent,
  1 equivalent.
- QQP: header naming ``question1, question2, is_duplicate``; 0 not_duplicate, 1 duplicate.
- STS-B: header naming ``sentence1, sentence2, score``; the score is a number from 0 to 5 (regression, no classes).
- MNLI: header naming ``sentence1, sentence2, gold_label``; entailment 0, neutral 1, contradiction 2.
- QNLI: header naming ``question, sentence, label``; entailment 0, not_entailment 1.
- RTE: header naming ``sentence1, sentence2, label``; entailment 0, not_entailment 1.

Where a file has a header its columns are found by name, so other columns (ids, parses, genre) may
come in any order; every row must have as many fields as the header. The one exception is QQP: the
real release's train file holds a few broken rows with missing fields (a question split across a
line break), which every GLUE loader drops; rows of QQP with too few fields are skipped with one
warning that counts them. Anything else malformed raises ValueError naming the file and line.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .provenance import note_read

__all__ = ["GLUE_TASKS", "GlueData", "GlueSplit", "load_glue"]


@dataclass(frozen=True)
class _Task:
    folder: str
    layout: str  # the expected layout, for error messages
    first: str | int  # column name (header) or index (no header)
    second: str | int | None
    label: str | int
    label_names: tuple[str, ...] | None  # None: float score
    label_values: tuple[str, ...] | None  # the label as written in the file, in class order
    splits: tuple[str, ...] = ("train", "dev")
    header: bool = True
    skip_short_rows: bool = False

    @property
    def width(self) -> int | None:
        """Fields per row of a headerless file."""
        return None if self.header else 4


_BINARY = ("0", "1")
_TASKS = {
    "cola": _Task(
        "CoLA",
        "no header; 4 tab-separated columns: source, label (0/1), original mark, sentence",
        3,
        None,
        1,
        ("unacceptable", "acceptable"),
        _BINARY,
        header=False,
    ),
    "sst2": _Task("SST-2", "header 'sentence<TAB>label', label 0/1", "sentence", None, "label", ("negative", "positive"), _BINARY),
    "mrpc": _Task(
        "MRPC",
        "header 'Quality<TAB>#1 ID<TAB>#2 ID<TAB>#1 String<TAB>#2 String', Quality 0/1",
        "#1 String",
        "#2 String",
        "Quality",
        ("not_equivalent", "equivalent"),
        _BINARY,
    ),
    "qqp": _Task(
        "QQP",
        "header with columns question1, question2, is_duplicate (0/1)",
        "question1",
        "question2",
        "is_duplicate",
        ("not_duplicate", "duplicate"),
        _BINARY,
        skip_short_rows=True,
    ),
    "stsb": _Task("STS-B", "header with columns sentence1, sentence2, score (0 to 5)", "sentence1", "sentence2", "score", None, None),
    "mnli": _Task(
        "MNLI",
        "header with columns sentence1, sentence2, gold_label (entailment/neutral/contradiction)",
        "sentence1",
        "sentence2",
        "gold_label",
        ("entailment", "neutral", "contradiction"),
        ("entailment", "neutral", "contradiction"),
        splits=("train", "dev_matched", "dev_mismatched"),
    ),
    "qnli": _Task(
        "QNLI",
        "header with columns question, sentence, label (entailment/not_entailment)",
        "question",
        "sentence",
        "label",
        ("entailment", "not_entailment"),
        ("entailment", "not_entailment"),
    ),
    "rte": _Task(
        "RTE",
        "header with columns sentence1, sentence2, label (entailment/not_entailment)",
        "sentence1",
        "sentence2",
        "label",
        ("entailment", "not_entailment"),
        ("entailment", "not_entailment"),
    ),
}
GLUE_TASKS = tuple(_TASKS)


@dataclass
class GlueSplit:
    """One split: the first texts, the second texts of pair tasks (else None), and the labels
    (int64 class ids; float32 scores for STS-B)."""

    first: list[str]
    second: list[str] | None
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.first)


@dataclass
class GlueData:
    """A GLUE task's labelled splits: ``train`` and ``dev`` (MNLI: ``dev_matched``, ``dev_mismatched``)."""

    task: str
    label_names: tuple[str, ...] | None  # None for STS-B (regression)
    splits: dict[str, GlueSplit]


def _task_dir(task: _Task, name: str, directory) -> Path:
    root = Path(directory)
    for candidate in (root / task.folder, root):
        if (candidate / f"{task.splits[0]}.tsv").is_file():
            return candidate
    raise ValueError(
        f"glue {name}: neither {root / task.folder} nor {root} holds {task.splits[0]}.tsv; expected the GLUE release "
        f"layout: {task.folder}/{{{', '.join(f'{split}.tsv' for split in task.splits)}}}"
    )


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    """(1-based line number, fields) of each line; a final empty line is dropped."""
    # MRPC's release files start with a byte order mark; lines end in "\n" or "\r\n", and a lone "\r"
    # stays inside its field (no universal newlines).
    note_read(path)
    try:
        with path.open(encoding="utf-8-sig", newline="") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"glue: {path} is not a readable UTF-8 TSV file: {error}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [(number, line.removesuffix("\r").split("\t")) for number, line in enumerate(lines, 1)]


def _read_split(task: _Task, name: str, path: Path) -> tuple[GlueSplit, int]:
    """The split in ``path`` and the number of short rows skipped (QQP only)."""
    if not path.is_file():
        raise ValueError(f"glue {name}: missing {path}; expected {task.layout}")
    rows = _rows(path)
    where = f"glue {name}: {path}"
    if task.header:
        if not rows:
            raise ValueError(f"{where} is empty; expected {task.layout}")
        header = rows.pop(0)[1]
        wanted = [column for column in (task.first, task.second, task.label) if column is not None]
        missing = [column for column in wanted if column not in header]
        if missing:
            raise ValueError(f"{where} line 1: header lacks {missing} (has {header}); expected {task.layout}")
        first, second, label = (None if column is None else header.index(column) for column in (task.first, task.second, task.label))
        width = len(header)
    else:
        first, second, label, width = task.first, task.second, task.label, task.width
    firsts, seconds, labels, short = [], [], [], 0
    for number, fields in rows:
        if len(fields) != width:
            if task.skip_short_rows and len(fields) < width:
                short += 1
                continue
            raise ValueError(f"{where} line {number}: {len(fields)} tab-separated fields, expected {width}; expected {task.layout}")
        value = fields[label]
        if task.label_values is None:
            try:
                score = float(value)
            except ValueError:
                score = math.nan
            if not 0 <= score <= 5:
                raise ValueError(f"{where} line {number}: score {value!r} is not a number from 0 to 5; expected {task.layout}")
            labels.append(score)
        else:
            if value not in task.label_values:
                raise ValueError(f"{where} line {number}: label {value!r} is not one of {list(task.label_values)}; expected {task.layout}")
            labels.append(task.label_values.index(value))
        firsts.append(fields[first])
        if second is not None:
            seconds.append(fields[second])
    if not labels:
        raise ValueError(f"{where} holds no examples; expected {task.layout}")
    dtype = torch.int64 if task.label_values is not None else torch.float32
    return GlueSplit(firsts, seconds if second is not None else None, torch.tensor(labels, dtype=dtype)), short


def load_glue(task: str, directory) -> GlueData:
    """The labelled splits of GLUE ``task`` (one of ``GLUE_TASKS``) from ``directory`` (see the module docstring)."""
    if task not in _TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; accepted: {', '.join(GLUE_TASKS)}")
    spec = _TASKS[task]
    folder = _task_dir(spec, task, directory)
    splits = {}
    for split in spec.splits:
        path = folder / f"{split}.tsv"
        splits[split], short = _read_split(spec, task, path)
        if short:
            warnings.warn(f"glue {task}: {path}: skipped {short} rows with too few fields (broken rows of the QQP release)", stacklevel=2)
    return GlueData(task, spec.label_names, splits)
