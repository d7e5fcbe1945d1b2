"""Text corpora as token ids; the disk cache (``cache.py``) makes the second run's tokenizing free.

``resolve_tokenizer(spec, corpus)`` turns ``--tokenizer`` into a ``Tokenizer`` (a BPE is learnt from
the training split only); ``tokenize_corpus(corpus, tokenizer)`` gives a ``TokenCorpus``. Both a
learnt BPE and the ids of each split are cached, keyed by a hash of their inputs (the text, and the
tokenizer's JSON or the vocabulary size), so changing either never reads a stale entry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .cache import cache_directory, cache_key, say, store
from .corpus import SPLITS, ByteCorpus
from .tokenizer import Tokenizer, byte_tokenizer, parse_tokenizer_spec, train_bpe


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
    windows: str = "across"  # training windows may cross documents; "within": each in one (prepared data only)

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
    path = cache_directory() / "bpe" / f"{cache_key(training_text, str(value))}.json"
    if path.is_file():
        try:
            tokenizer = Tokenizer.from_json(path.read_text(), spec)
            say(f"tokenizer {spec}: read from the cache {path}", progress)
            return tokenizer
        except Exception:  # a damaged entry (the library raises bare Exceptions) is learnt again
            path.unlink(missing_ok=True)
    started = time.perf_counter()
    tokenizer = train_bpe(training_text, value, progress=progress, source=source)
    store(path, lambda file: file.write(tokenizer.to_json().encode()))
    say(f"tokenizer {spec}: learnt from {len(training_text):,} bytes in {time.perf_counter() - started:.1f} s, cached at {path}", progress)
    return tokenizer


def cached_encode(tokenizer: Tokenizer, data: bytes, progress: bool = False, source: str = "the data") -> tuple[torch.Tensor, str]:
    """``tokenizer.encode(data, source=source)`` through the cache, and a note of what it cost."""
    if tokenizer.is_bytes:
        return tokenizer.encode(data), "bytes are their own ids"
    started = time.perf_counter()
    path = cache_directory() / "tokens" / f"{cache_key(tokenizer.to_json(), data)}.npy"
    if path.is_file():
        try:
            ids = np.load(path, allow_pickle=False)
            if isinstance(ids, np.ndarray) and ids.dtype == np.int32 and ids.ndim == 1 and _in_range(ids, tokenizer.vocab_size):
                return torch.from_numpy(ids), f"{len(ids):,} tokens read from the cache in {time.perf_counter() - started:.2f} s"
        except Exception:  # whatever numpy makes of a damaged entry (ValueError, EOFError, zipfile's errors, ...)
            pass
        path.unlink(missing_ok=True)  # a damaged entry is tokenized again
    ids = tokenizer.encode(data, progress=progress, source=source)
    seconds = time.perf_counter() - started
    store(path, lambda file: np.save(file, ids.numpy()))
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
        say(f"tokenized {corpus.source} with {tokenizer.name}: " + "; ".join(notes), progress)
    return TokenCorpus(corpus.source, tokenizer, notes=notes, **splits)
