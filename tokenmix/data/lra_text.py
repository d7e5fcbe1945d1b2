"""LRA Text: IMDB reviews (Maas et al. 2011) classified from their bytes (Long Range Arena, Tay et al. 2020,
arXiv 2011.04006).

Files: the aclImdb release, ``aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt``; DIR may hold
``aclImdb/`` or be it. Tokens are the review's UTF-8 bytes (vocabulary 256), cut to ``max_length``
(default 4000: the benchmark's 4K; LRA's code configuration uses 1000).
Labels: neg 0, pos 1. The release has no validation split: ``val_fraction`` of train (default 0.1)
is held out at random by the run's seed (LRA's code validates on the test split instead); test is
the release's test split.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..io.progress import progress_bar
from ..validation import check_int, check_number
from .corpus import BYTE_VOCAB
from .examples import ClassificationData, Examples
from .release_files import Layout, seeded_parts

MAX_LENGTH = 4000
VAL_FRACTION = 0.1
CLASSES = ("neg", "pos")  # label = index
RELEASE = Layout("lra-text", "the aclImdb release: aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt", ("aclImdb", ""))
_NAME = re.compile(r"(\d+)_(\d+)\.txt")


def _review_files(root, split: str) -> list[tuple[Path, int]]:
    """(file, label) of one split, by class, then by review id."""
    files = []
    for label, name in enumerate(CLASSES):
        folder = RELEASE.require(root, f"{split}/{name}")
        ids = {path: _NAME.fullmatch(path.name) for path in folder.glob("*.txt")}
        wrong = sorted(path.name for path, match in ids.items() if match is None)
        if wrong or not ids:
            raise ValueError(f"lra-text: {folder} holds {f'files not named <id>_<rating>.txt: {wrong[:3]}' if wrong else 'no reviews'}")
        files += [(path, label) for path in sorted(ids, key=lambda path: int(ids[path].group(1)))]
    return files


def _read_split(root, split: str, max_length: int) -> Examples:
    files = _review_files(root, split)
    texts = [RELEASE.read(path)[:max_length] for path, _ in progress_bar(files, desc=f"imdb {split}", unit="file")]
    empty = [path for (path, _), text in zip(files, texts, strict=True) if not text]
    if empty:
        raise ValueError(f"lra-text: {empty[0]} is empty{f' (and {len(empty) - 1} more)' if len(empty) > 1 else ''}; a review has text")
    return Examples.from_sequences(texts, [label for _, label in files], dtype=torch.uint8)


def load_lra_text(directory, *, max_length: int = MAX_LENGTH, val_fraction: float = VAL_FRACTION, seed: int = 0) -> ClassificationData:
    """IMDB from ``directory`` (see the module docstring)."""
    check_int(max_length, "lra-text max_length")
    check_number(val_fraction, "lra-text val_fraction", 0, 1, open_minimum=True, open_maximum=True)
    root = RELEASE.root(directory, "train/pos")
    RELEASE.require(root, "test/pos")
    train = _read_split(root, "train", max_length)
    train_part, val_part = seeded_parts(len(train), [val_fraction], seed, "lra-text")
    source = f"lra-text:{directory}:max_length={max_length}:val_fraction={val_fraction}"
    return ClassificationData(
        source, BYTE_VOCAB, len(CLASSES), train.subset(train_part), train.subset(val_part), _read_split(root, "test", max_length)
    )
