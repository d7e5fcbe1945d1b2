"""Text corpora as token ids, and the disk cache that makes the second run's tokenizing free.

``resolve_tokenizer(spec, corpus)`` turns ``--tokenizer`` into a ``Tokenizer`` (a BPE is learnt from
the training split only); ``tokenize_corpus(corpus, tokenizer)`` gives a ``TokenCorpus``. Both a
learnt BPE and the ids of each split are cached under ``$TOKENMIX_CACHE`` (default
``~/.cache/tokenmix``), keyed by a hash of their inputs (the text, and the tokenizer's JSON or the
vocabulary size), so changing either never reads a stale entry. Writes are atomic (a temporary
file of the writing process, then a rename).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tokenizers
import torch

from .corpus import SPLITS, ByteCorpus
from .tokenizer import Tokenizer, byte_tokenizer, parse_tokenizer_spec, train_bpe

CACHE_VARIABLE = "TOKENMIX_CACHE"
CACHE_FORMAT = "2"  # bumped when what a cache entry holds changes


def cache_directory() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "tokenmix").expanduser()


def _key(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in (CACHE_FORMAT, tokenizers.__version__, *parts):
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:32]


def _store(path: Path, write) -> None:
    """``write(file)`` to a temporary file of this process, renamed to ``path``: processes of one
    run (DDP ranks) may fill the same entry at once, and every one of them writes the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as file:
        write(file)
    os.replace(temporary, path)


def _say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


@dataclass
class TokenCorpus:
    """The three splits of a text corpus as token ids of ``tokenizer``; ``notes`` say how long
    tokenizing took and whether the cache served it."""

    source: str
    tokenizer: Tokenizer
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    notes: list[str] = field(default_factory=list)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def split(self, name: str) -> torch.Tensor:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {name!r}")
        return getattr(self, name)


def split_bytes(corpus: ByteCorpus, name: str) -> bytes:
    return corpus.split(name).numpy().tobytes()


def resolve_tokenizer(
    spec: str | Tokenizer, training_text: bytes | None = None, progress: bool = False, source: str = "the training split"
) -> Tokenizer:
    """``--tokenizer`` as a Tokenizer: bytes, a saved file, or a BPE learnt from ``training_text`` (cached;
    ``source`` says where the text came from, for errors)."""
    if isinstance(spec, Tokenizer):
        return spec
    kind, value = parse_tokenizer_spec(spec)
    if kind == "bytes":
        return byte_tokenizer()
    if kind == "file":
        return Tokenizer.load(value)
    if training_text is None:
        raise ValueError(f"tokenizer {spec!r} is learnt from a text corpus's training split; this data has none")
    path = cache_directory() / "bpe" / f"{_key(training_text, str(value))}.json"
    if path.is_file():
        try:
            tokenizer = Tokenizer.from_json(path.read_text(), spec)
            _say(f"tokenizer {spec}: read from the cache {path}", progress)
            return tokenizer
        except Exception:  # a damaged entry (the library raises bare Exceptions) is learnt again
            path.unlink(missing_ok=True)
    started = time.perf_counter()
    tokenizer = train_bpe(training_text, value, progress=progress, source=source)
    _store(path, lambda file: file.write(tokenizer.to_json().encode()))
    _say(f"tokenizer {spec}: learnt from {len(training_text):,} bytes in {time.perf_counter() - started:.1f} s, cached at {path}", progress)
    return tokenizer


def cached_encode(tokenizer: Tokenizer, data: bytes, progress: bool = False, source: str = "the data") -> tuple[torch.Tensor, str]:
    """``tokenizer.encode(data, source=source)`` through the cache, and a note of what it cost."""
    if tokenizer.is_bytes:
        return tokenizer.encode(data), "bytes are their own ids"
    started = time.perf_counter()
    path = cache_directory() / "tokens" / f"{_key(tokenizer.to_json(), data)}.npy"
    if path.is_file():
        try:
            ids = np.load(path)
            if isinstance(ids, np.ndarray) and ids.dtype == np.int32 and ids.ndim == 1 and _in_range(ids, tokenizer.vocab_size):
                return torch.from_numpy(ids), f"{len(ids):,} tokens read from the cache in {time.perf_counter() - started:.2f} s"
        except Exception:  # whatever numpy makes of a damaged entry (ValueError, EOFError, zipfile's errors, ...)
            pass
        path.unlink(missing_ok=True)  # a damaged entry is tokenized again
    ids = tokenizer.encode(data, progress=progress, source=source)
    seconds = time.perf_counter() - started
    _store(path, lambda file: np.save(file, ids.numpy()))
    return ids, f"{len(data):,} bytes -> {len(ids):,} tokens in {seconds:.2f} s ({len(data) / max(len(ids), 1):.2f} bytes/token), cached"


def _in_range(ids: np.ndarray, vocab_size: int) -> bool:
    return ids.size == 0 or 0 <= int(ids.min()) <= int(ids.max()) < vocab_size


def tokenize_corpus(corpus: ByteCorpus, tokenizer: Tokenizer, progress: bool = False) -> TokenCorpus:
    """The corpus as ids of ``tokenizer``, split by split (each through the cache)."""
    splits, notes = {}, []
    for name in SPLITS:
        splits[name], note = cached_encode(tokenizer, split_bytes(corpus, name), progress, f"data {corpus.source!r} (its {name} split)")
        if len(splits[name]) < 2:
            raise ValueError(f"data {corpus.source!r}: the {name} split holds {len(splits[name])} tokens; at least 2 are needed")
        notes.append(f"{name}: {note}")
    if not tokenizer.is_bytes:
        _say(f"tokenized {corpus.source} with {tokenizer.name}: " + "; ".join(notes), progress)
    return TokenCorpus(corpus.source, tokenizer, notes=notes, **splits)
