"""``--data glue-TASK:DIR``: a GLUE task as token ids for classification (regression for STS-B).

Each text is tokenized with the run's tokenizer (a fine-tuned run: its pretrained run's); a pair
(MRPC, QQP, STS-B, MNLI, QNLI, RTE) is one sequence, ``first SEP second``, with SEP the
tokenizer's end-of-document token (bytes: a newline). Sequences are cut to ``max_length`` tokens
(default 256), each text of a pair to its half. Splits: ``train`` is train.tsv less a seeded
``val_fraction`` (default 0.05) held out for validation during training; ``test`` is the
release's labelled dev file (``dev.tsv``; MNLI ``dev_matched.tsv``, or ``dev_mismatched.tsv``
with ``:dev=mismatched``), the split GLUE results are quoted on.
"""

from __future__ import annotations

import torch

from ..validation import check_number
from .examples import ClassificationData, Examples
from .glue import GLUE_TASKS, GlueSplit, load_glue
from .release_files import seeded_parts
from .spec import SourceSpec
from .tokenizer import Tokenizer

PREFIX = "glue-"
DEV_FILES = {"matched": "dev_matched", "mismatched": "dev_mismatched"}
NEWLINE = 10


def glue_task(source: str) -> str | None:
    """The GLUE task a ``--data`` source names (``glue-sst2:DIR`` -> ``sst2``), None if it names none."""
    if not source.startswith(PREFIX):
        return None
    task = source[len(PREFIX) :].split(":", 1)[0]
    if task not in GLUE_TASKS:
        raise ValueError(f"data {source!r}: unknown GLUE task {task!r}; accepted: {', '.join(PREFIX + name for name in GLUE_TASKS)}")
    return task


def training_text(spec: SourceSpec) -> bytes:
    """Every text of the training file, one per line (what a BPE for this task learns from)."""
    split = load_glue(glue_task(spec.name), spec.directory).splits["train"]
    return "\n".join(split.first + (split.second or [])).encode()


def _sequences(split: GlueSplit, tokenizer: Tokenizer, max_length: int) -> list[list[int]]:
    separator = tokenizer.end_of_document_id if tokenizer.end_of_document_id is not None else NEWLINE
    firsts = tokenizer.encode_texts(split.first)
    if split.second is None:
        return [ids[:max_length] for ids in firsts]
    half = (max_length - 1) // 2
    return [first[:half] + [separator] + second[:half] for first, second in zip(firsts, tokenizer.encode_texts(split.second), strict=True)]


def _examples(split: GlueSplit, tokenizer: Tokenizer, max_length: int) -> Examples:
    return Examples.from_sequences(_sequences(split, tokenizer, max_length), split.labels, dtype=torch.int32)


def load_glue_task(
    spec: SourceSpec, tokenizer: Tokenizer, seed: int = 0, *, max_length: int = 256, val_fraction: float = 0.05, dev: str = "matched"
) -> ClassificationData:
    """The task ``spec`` names as ClassificationData (see the module docstring)."""
    task = glue_task(spec.name)
    if max_length < 3:
        raise ValueError(f"data {spec.name!r}: max_length must be at least 3 tokens, got {max_length}")
    check_number(val_fraction, f"data {spec.name!r}: val_fraction", 0, 1, open_minimum=True, open_maximum=True)
    if dev not in DEV_FILES:
        raise ValueError(f"data {spec.name!r}: dev must be one of {list(DEV_FILES)}, got {dev!r}")
    if dev != "matched" and task != "mnli":
        raise ValueError(f"data {spec.name!r}: dev=mismatched applies to glue-mnli only")
    data = load_glue(task, spec.directory)
    train = _examples(data.splits["train"], tokenizer, max_length)
    kept, held = seeded_parts(len(train), [val_fraction], seed, spec.name)
    test = _examples(data.splits[DEV_FILES[dev] if task == "mnli" else "dev"], tokenizer, max_length)
    classes = 1 if data.label_names is None else len(data.label_names)
    source = f"{spec.name}:{spec.directory}:max_length={max_length}" + (f":dev={dev}" if task == "mnli" else "")
    return ClassificationData(
        source, tokenizer.vocab_size, classes, train.subset(kept), train.subset(held), test, tokenizer=tokenizer, glue_task=task
    )
