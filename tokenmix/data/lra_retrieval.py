"""LRA Retrieval: do two ACL Anthology Network papers cite one another? (Radev et al. 2013; Long Range Arena,
Tay et al. 2020, arXiv 2011.04006).

Files: the release's ``tsv_data/new_aan_pairs.{train,eval,test}.tsv`` (DIR may hold ``tsv_data/`` or
be it): no header, tab-separated columns label, id1, id2, text1, text2, no quoting. Each example is
two documents (``documents=2``), each its UTF-8 bytes cut to ``max_length`` (default 4000, as LRA);
vocabulary 256; 2 classes (the label column, 0 or 1, may be written as a float). The eval file is
the validation split.
"""

from __future__ import annotations

import torch

from ..io.progress import progress_bar
from ..validation import check_int
from .corpus import BYTE_VOCAB
from .examples import ClassificationData, Examples
from .release_files import Layout

MAX_LENGTH = 4000
FILES = {"train": "train", "val": "eval", "test": "test"}  # split -> the release's file name part
RELEASE = Layout("lra-retrieval", "the release's tsv_data/new_aan_pairs.{train,eval,test}.tsv", ("tsv_data", ""))


def _read_split(path, max_length: int) -> Examples:
    documents, labels = [], []
    with RELEASE.open(path) as file, progress_bar(total=path.stat().st_size, desc=path.name, unit="B", unit_scale=True) as bar:
        for number, line in enumerate(file, start=1):
            bar.update(len(line))
            fields = line.rstrip(b"\r\n").split(b"\t")
            label = _label(fields[0]) if len(fields) == 5 else None
            if label is None:
                raise ValueError(
                    f"lra-retrieval: {path} line {number}: expected 5 tab-separated columns label (0 or 1), id1, id2, text1, text2"
                )
            documents += [fields[3][:max_length], fields[4][:max_length]]
            labels.append(label)
    if not labels:
        raise ValueError(f"lra-retrieval: {path} holds no pairs")
    return Examples.from_sequences(documents, labels, documents=2, dtype=torch.uint8)


def _label(text: bytes) -> int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value in (0.0, 1.0) else None


def load_lra_retrieval(directory, *, max_length: int = MAX_LENGTH) -> ClassificationData:
    """AAN pairs from ``directory`` (see the module docstring)."""
    check_int(max_length, "lra-retrieval max_length")
    root = RELEASE.root(directory, "new_aan_pairs.train.tsv")
    paths = {split: RELEASE.require(root, f"new_aan_pairs.{name}.tsv") for split, name in FILES.items()}
    splits = {split: _read_split(path, max_length) for split, path in paths.items()}
    return ClassificationData(f"lra-retrieval:{directory}:max_length={max_length}", BYTE_VOCAB, 2, **splits)
