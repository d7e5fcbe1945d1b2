"""A prepared dataset (``tokenmix prepare``, format in ``prepare.py``) read in place.

Each split is its shard files end to end (``TokenFiles``), sliced as a 1-D tensor is: a slice is read with
positional reads (``os.pread``), so a run holds the windows it draws and no more. Mapping the files would
serve the same bytes, but every page a random window touched would then count toward the process's
resident memory, which would grow with the corpus over a long run.

Opening checks what is cheap to check (the manifest against the files: each file's size, each index's
offsets); the ids themselves are checked as they are read (below the vocabulary).
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import MachineFault
from .prepare import FORMAT, MANIFEST, VERSION, shard_name
from .provenance import note_read
from .shard_encoder import SPLITS
from .tokenized import TokenCorpus
from .tokenizer import TOKENIZER_FILE, Tokenizer

WINDOWS = ("across", "within")  # training windows: free to cross documents, or each within one document


def prepared_folder(source: str) -> tuple[str, dict[str, str]] | None:
    """(folder, options) when ``--data`` is ``DIR[:key=value...]`` of a folder ``tokenmix prepare`` wrote, else None."""
    parts = source.split(":")
    for end in range(len(parts), 0, -1):
        folder = ":".join(parts[:end])
        if folder and Path(folder).expanduser().joinpath(MANIFEST).is_file():
            options = dict(part.partition("=")[::2] for part in parts[end:])
            if any("=" not in part for part in parts[end:]):
                raise ValueError(f"data {source!r}: the accepted form is DIR[:windows=across|within]")
            return folder, options
    return None


class TokenFiles:
    """One split: the ids of ``files`` (paths, with their token counts) one after another, ``dtype`` on disk.

    ``numel()``, ``len()`` and slicing with a step of 1 (int64 tensors) are what batches and evaluation use."""

    def __init__(self, files: list[tuple[Path, int]], dtype: np.dtype, vocab_size: int):
        self.paths = [path for path, _ in files]
        self.ends = np.cumsum([count for _, count in files]).tolist()
        self.dtype, self.vocab_size = dtype, vocab_size
        self._handles: dict[int, int] = {}
        self._offsets: dict[int, np.ndarray] = {}

    def numel(self) -> int:
        return self.ends[-1] if self.ends else 0

    def document_at(self, position: int) -> tuple[int, int]:
        """[start, end) of the document holding id ``position`` (its separator last), from the shard's index."""
        index = bisect.bisect_right(self.ends, position)
        first = self.ends[index - 1] if index else 0
        if index not in self._offsets:
            self._offsets[index] = np.memmap(self.paths[index].with_suffix(".idx"), dtype="<i8", mode="r")
        offsets = self._offsets[index]
        document = int(np.searchsorted(offsets, position - first, side="right")) - 1
        return first + int(offsets[document]), first + int(offsets[document + 1])

    def __len__(self) -> int:
        return self.numel()

    def __getitem__(self, key: slice) -> torch.Tensor:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"a prepared split is read by slices with a step of 1, got {key!r}")
        start, stop, _ = key.indices(self.numel())
        pieces = []
        while start < stop:
            index = bisect.bisect_right(self.ends, start)
            first = self.ends[index - 1] if index else 0
            count = min(stop, self.ends[index]) - start
            pieces.append(self._read(index, start - first, count))
            start += count
        ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=self.dtype)
        return torch.from_numpy(ids.astype(np.int64))

    def _read(self, index: int, offset: int, count: int) -> np.ndarray:
        """``count`` ids of file ``index`` from its id ``offset``; a short read or an id past the vocabulary is a
        fault of the file (it changed or broke since it was opened), named in one line."""
        path = self.paths[index]
        if index not in self._handles:
            self._handles[index] = os.open(path, os.O_RDONLY)
        size = count * self.dtype.itemsize
        data = os.pread(self._handles[index], size, offset * self.dtype.itemsize)
        if len(data) != size:
            raise MachineFault(f"data file {str(path)!r} ends early: {len(data)} of {size} bytes at id {offset}; prepare it again")
        ids = np.frombuffer(data, dtype=self.dtype)
        if ids.size and int(ids.max()) >= self.vocab_size:
            raise MachineFault(
                f"data file {str(path)!r} is corrupt: id {int(ids.max())} near id {offset} is past its vocabulary ({self.vocab_size}); "
                "prepare it again"
            )
        return ids

    def __del__(self):
        for handle in getattr(self, "_handles", {}).values():
            os.close(handle)


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    note_read(path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"data {str(folder)!r}: {MANIFEST} is unreadable ({error}); prepare the data again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"data {str(folder)!r}: {MANIFEST} is not a tokenmix prepare manifest (its format is not {FORMAT!r})")
    if manifest.get("version") != VERSION:
        raise ValueError(f"data {str(folder)!r}: manifest version {manifest.get('version')!r}; this tokenmix reads version {VERSION}")
    return manifest


def check_shard(folder: Path, name: str, tokens: int, documents: int, dtype: np.dtype) -> Path:
    """The shard's .bin, after its size and its index were checked against the manifest's counts."""
    binary, index = folder / f"{name}.bin", folder / f"{name}.idx"
    for path, expected in ((binary, tokens * dtype.itemsize), (index, (documents + 1) * 8)):
        if not path.is_file():
            raise ValueError(f"data {str(folder)!r}: {path.name} is missing (the manifest lists it); prepare the data again")
        size = path.stat().st_size
        if size != expected:
            raise ValueError(
                f"data {str(folder)!r}: {path.name} holds {size:,} bytes, the manifest says {expected:,}: it is truncated or corrupt"
            )
    offsets = np.fromfile(index, dtype="<i8")
    if offsets[0] != 0 or offsets[-1] != tokens or (np.diff(offsets) < 1).any():
        raise ValueError(
            f"data {str(folder)!r}: {index.name} is corrupt (its offsets do not cut {tokens:,} ids into {documents:,} documents)"
        )
    return binary


def open_prepared(source: str, tokenizer: str | Tokenizer | None = None) -> TokenCorpus:
    """The splits of the prepared folder of ``source`` (``DIR[:windows=across|within]``); ``tokenizer``: the one
    the run asks for, which must be the folder's own (None or the default spec ``"bytes"`` takes the folder's)."""
    path, options = prepared_folder(source)
    windows = options.pop("windows", "across")
    if windows not in WINDOWS or options:
        raise ValueError(f"data {source!r}: the options of a prepared folder are windows={'|'.join(WINDOWS)}, got {source.split(':')[1:]}")
    folder = Path(path).expanduser()
    manifest = read_manifest(folder)
    own = Tokenizer.load(folder / TOKENIZER_FILE)
    if own.fingerprint != manifest["tokenizer"]["fingerprint"]:
        raise ValueError(f"data {source!r}: {TOKENIZER_FILE} is not the tokenizer the manifest names ({manifest['tokenizer']['name']})")
    asked = tokenizer if isinstance(tokenizer, Tokenizer) or tokenizer in (None, "bytes") else Tokenizer.load(tokenizer)
    if isinstance(asked, Tokenizer) and asked != own:
        raise ValueError(
            f"data {source!r} holds ids of its own tokenizer ({own.name}, {TOKENIZER_FILE} in it), not of --tokenizer {asked.name} "
            f"({asked.source}); leave --tokenizer out to read it with its own"
        )
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    splits = {}
    for split in SPLITS:
        files = [
            (
                check_shard(folder, shard_name(split, chunk["chunk"]), chunk[split]["tokens"], chunk[split]["documents"], dtype),
                chunk[split]["tokens"],
            )
            for chunk in manifest["chunks"]
            if split in chunk
        ]
        splits[split] = TokenFiles(files, dtype, own.vocab_size)
        if splits[split].numel() < 2:
            raise ValueError(
                f"data {source!r}: its {split} split holds {splits[split].numel()} ids (a document's split is decided by its hash: "
                "prepare more documents, e.g. with --text-unit paragraph, or other --val-fraction / --test-fraction)"
            )
    notes = [f"prepared: {manifest['splits']['train']['tokens']:,} training ids, windows {windows} documents"]
    return TokenCorpus(source, own, notes=notes, windows=windows, **splits)
