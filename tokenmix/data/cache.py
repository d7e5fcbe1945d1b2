"""The on-disk cache of data that is slow to make: learnt BPEs, token ids, generated tasks (ListOps).

Entries live under ``$TOKENMIX_CACHE`` (default ``~/.cache/tokenmix``), named by a hash of
everything that made them (the text, the tokenizer, a generator's version and options), so a
change never reads a stale entry. Writes are atomic (a temporary file of the writing process,
then a rename). Entries are data (JSON, ``.npy``, ``.npz`` read without pickle); a damaged one is
made again.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import tokenizers
import torch

from ..io.files import TEMPORARY_SUFFIX, atomic_write
from .examples import Examples

CACHE_VARIABLE = "TOKENMIX_CACHE"
CACHE_FORMAT = "2"  # bumped when what a cache entry holds changes


def cache_directory() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "tokenmix").expanduser()


def cache_key(*parts: bytes | str) -> str:
    """A hash of ``parts`` (and of the cache format and the tokenizers version), unambiguous in their boundaries."""
    digest = hashlib.sha256()
    for part in (CACHE_FORMAT, tokenizers.__version__, *parts):
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:32]


def store(path: Path, write) -> None:
    """``write(file)`` to a temporary file of this process, renamed to ``path``: processes of one
    run (DDP ranks) may fill the same entry at once, and every one of them writes the same bytes."""
    atomic_write(path, lambda temporary: _write_file(temporary, write), suffix=f".{os.getpid()}{TEMPORARY_SUFFIX}")


def _write_file(path: Path, write) -> None:
    with open(path, "wb") as file:
        write(file)


def say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def store_examples(path: Path, splits: dict[str, Examples]) -> None:
    """Labelled splits as one ``.npz`` of plain arrays (tokens, offsets, labels, documents per split)."""
    arrays = {}
    for name, examples in splits.items():
        arrays.update({f"{name}.tokens": examples.tokens.numpy(), f"{name}.offsets": examples.offsets.numpy()})
        arrays.update({f"{name}.labels": examples.labels.numpy(), f"{name}.documents": np.array(examples.documents)})
    store(path, lambda file: np.savez(file, **arrays))


def load_examples(path: Path, names) -> dict[str, Examples] | None:
    """The splits ``store_examples`` wrote, or None when the entry is absent or damaged (it is then removed)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {
                name: Examples(
                    torch.from_numpy(arrays[f"{name}.tokens"]),
                    torch.from_numpy(arrays[f"{name}.offsets"]),
                    torch.from_numpy(arrays[f"{name}.labels"]),
                    int(arrays[f"{name}.documents"]),
                )
                for name in names
            }
    except (OSError, ValueError, KeyError, EOFError):
        path.unlink(missing_ok=True)
        return None
