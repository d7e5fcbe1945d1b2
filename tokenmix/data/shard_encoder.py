"""Documents to token ids for ``tokenmix prepare``, in whichever process encodes them: numpy and the
``tokenizers`` library only (a worker process starts without importing torch).

A document's ids are those ``Tokenizer.encode`` gives its text (a BPE encodes line by line, so a token
never spans a newline), then the separator; its split is decided by its hash (``document_split``), so
every run of prepare, whatever its chunks or processes, puts it in the same split.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import signal
from dataclasses import dataclass

import numpy as np

SPLITS = ("train", "val", "test")
HASH_SCALE = float(1 << 64)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def document_split(text: str, val_fraction: float, test_fraction: float) -> str:
    """ "val" when u < val_fraction, "test" when u < val_fraction + test_fraction, else "train", where u in [0, 1)
    is the first 8 bytes of the document's BLAKE2b digest read as an integer over 2^64."""
    u = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / HASH_SCALE
    return "val" if u < val_fraction else "test" if u < val_fraction + test_fraction else "train"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 for a vocabulary of at most 65,536 ids, else uint32 (little-endian, as the files hold them)."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass
class ChunkTokens:
    """One split's share of a chunk: the ids of its documents one after another, and ``offsets`` (int64, one
    more than the documents): document i is ``tokens[offsets[i]:offsets[i + 1]]``, the separator last."""

    tokens: np.ndarray
    offsets: np.ndarray


class ShardEncoder:
    """Encodes chunks of documents into ``{split: ChunkTokens}`` (splits without a document left out).

    ``tokenizer_json``: the tokenizer's ``tokenizer.json`` text, or None for bytes (id = UTF-8 byte)."""

    def __init__(self, tokenizer_json: str | None, separator: int, dtype: str, val_fraction: float, test_fraction: float):
        self.separator, self.dtype = separator, np.dtype(dtype)
        self.fractions = (val_fraction, test_fraction)
        self.backend = None
        if tokenizer_json is not None:
            from tokenizers import Tokenizer as Backend

            self.backend = Backend.from_str(tokenizer_json)
            self.backend.encode_special_tokens = True  # as tokenmix's Tokenizer: "</s>" in a text is text

    def encode(self, documents: list[str]) -> list[np.ndarray]:
        """Each document's ids (without the separator)."""
        if self.backend is None:
            return [np.frombuffer(text.encode(), dtype=np.uint8) for text in documents]
        lines = [text.splitlines(keepends=True) for text in documents]
        encodings = iter(self.backend.encode_batch(list(itertools.chain.from_iterable(lines)), add_special_tokens=False))
        ids = []
        for document in lines:
            parts = [encoding.ids for encoding in itertools.islice(encodings, len(document))]
            ids.append(np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int64, count=sum(map(len, parts))))
        return ids

    def __call__(self, documents: list[str]) -> dict[str, ChunkTokens]:
        by_split: dict[str, list[np.ndarray]] = {}
        for text, ids in zip(documents, self.encode(documents), strict=True):
            by_split.setdefault(document_split(text, *self.fractions), []).append(ids)
        separator = np.array([self.separator], dtype=self.dtype)
        chunk = {}
        for split in SPLITS:
            if split in by_split:
                ids = by_split[split]
                offsets = np.zeros(len(ids) + 1, dtype=np.int64)
                offsets[1:] = np.cumsum([len(part) + 1 for part in ids])
                chunk[split] = ChunkTokens(
                    np.concatenate([piece for part in ids for piece in (part.astype(self.dtype), separator)]), offsets
                )
        return chunk


_encoder: ShardEncoder | None = None


def die_with(parent: int) -> None:
    """On Linux, have the kernel kill this process when ``parent`` dies (``PR_SET_PDEATHSIG``): a forked worker holds
    its pool's queue open itself, so a prepare killed outright would otherwise leave its workers waiting on it."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def start_worker(parent: int, *arguments) -> None:
    """A worker process's initializer: it dies with ``parent``; the encoder it keeps (``ShardEncoder(*arguments)``),
    one thread (the processes are the parallelism)."""
    global _encoder
    die_with(parent)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _encoder = ShardEncoder(*arguments)


def encode_in_worker(documents: list[str]) -> dict[str, ChunkTokens]:
    return _encoder(documents)
