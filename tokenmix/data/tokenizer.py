"""Tokenizers: raw bytes (the default) or byte-level BPE, both held as a ``tokenizers.Tokenizer``.

The ``--tokenizer`` argument:

- ``bytes``: token id = UTF-8 byte, 256 ids, no special tokens (masked LM uses id 256, one past
  the bytes, as its mask).
- ``bpe:V``: a byte-level BPE of V entries (GPT-2's scheme: Radford et al., "Language Models are
  Unsupervised Multitask Learners", 2019) trained on the training split by the ``tokenizers``
  library. Its first ids are the special tokens ``</s>`` (end of document), ``<pad>`` and ``<mask>``.
- ``PATH``: a saved ``tokenizer.json`` (a run's, or a GPT-2 / RoBERTa one a user has). It must be
  byte level (every token spells bytes through the byte-level alphabet), since decoding and bits
  per byte need each token's bytes.

A tokenizer knows each token's bytes (``token_bytes``), so ``decode`` is exact, byte for byte,
for any id sequence, and bits per byte count the bytes the predicted tokens stand for.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, trainers

from ..io.files import write_text_atomic
from ..io.progress import progress_bar
from .corpus import BYTE_VOCAB, as_tensor

BYTES = "bytes"
BPE_PREFIX = "bpe:"
TOKENIZER_FILE = "tokenizer.json"
END_OF_DOCUMENT, PAD, MASK = "</s>", "<pad>", "<mask>"
SPECIAL_TOKENS = (END_OF_DOCUMENT, PAD, MASK)
END_OF_DOCUMENT_NAMES = (END_OF_DOCUMENT, "<|endoftext|>")  # ours (and RoBERTa's), GPT-2's
MIN_BPE_VOCAB = BYTE_VOCAB + len(SPECIAL_TOKENS) + 1
ENCODE_CHUNK = 4096  # lines per encode_batch call (the progress bar's step)


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """The byte-level alphabet: each byte's printable stand-in (GPT-2's table, which the
    ``tokenizers`` ByteLevel pre-tokenizer and decoder use): printable Latin-1 bytes stand for
    themselves, the others for the code points from 256 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {byte: chr(byte) if byte in printable else chr(next(extra)) for byte in range(256)}


def _byte_level(backend: Backend) -> Backend:
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def _decodes_byte_level(backend: Backend) -> bool:
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    return any(part.get("type") == "ByteLevel" for part in parts)


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with exact byte decoding and the special ids tokenmix uses.

    ``name`` says what it is (``bytes``, or ``bpe:V`` for a byte-level BPE of V ids, a GPT-2 file's
    included), ``source`` where it came from; ``vocab_size`` counts every id, special tokens
    included; ``mask_id``, ``pad_id`` and ``end_of_document_id`` are None when it has no such
    token (bytes: the mask is id 256, one past the vocabulary). A BPE learns fewer merges than
    asked when its text runs out of pairs: its name gives the size it has.
    """

    def __init__(self, backend: Backend, source: str):
        self.backend, self.source = backend, source
        backend.encode_special_tokens = True  # "</s>" written in a text is text, never the special id
        vocab = backend.get_vocab(with_added_tokens=True)
        if not backend.get_vocab(with_added_tokens=False):
            raise ValueError(f"tokenizer {source!r} has no tokens (special ones aside): its vocabulary is empty")
        self.vocab_size = max(vocab.values()) + 1  # ids a file leaves unused still count
        if not _decodes_byte_level(backend):
            raise ValueError(
                f"tokenizer {source!r} is not byte level (its decoder is not ByteLevel); tokenmix reads byte-level BPE tokenizers "
                "(GPT-2's and RoBERTa's kind) or --tokenizer bytes / bpe:V, since exact decoding and bits per byte need each token's bytes"
            )
        specials = {token.content: index for index, token in backend.get_added_tokens_decoder().items() if token.special}
        stand_in = {char: byte for byte, char in byte_alphabet().items()}
        self.token_bytes: list[bytes] = [b""] * self.vocab_size
        for token, index in vocab.items():
            if token in specials:
                continue
            if any(char not in stand_in for char in token):
                raise ValueError(
                    f"tokenizer {source!r} is not byte level: token {token!r} (id {index}) is not spelled in the byte-level alphabet; "
                    "tokenmix reads byte-level BPE tokenizers (GPT-2's and RoBERTa's kind) or --tokenizer bytes / bpe:V"
                )
            self.token_bytes[index] = bytes(stand_in[char] for char in token)
        self.byte_lengths = torch.tensor([len(piece) for piece in self.token_bytes], dtype=torch.long)
        # ids 0-255 are the bytes, and any others special tokens (an exported byte masked LM's <mask>)
        self.is_bytes = self.token_bytes[:BYTE_VOCAB] == [bytes([byte]) for byte in range(BYTE_VOCAB)]
        self.is_bytes &= all(not piece for piece in self.token_bytes[BYTE_VOCAB:])
        self.name = BYTES if self.is_bytes else f"{BPE_PREFIX}{self.vocab_size}"
        self.pad_id = specials.get(PAD)
        self.end_of_document_id = next((specials[name] for name in END_OF_DOCUMENT_NAMES if name in specials), None)
        self.mask_id = specials.get(MASK, BYTE_VOCAB if self.is_bytes else None)
        self.fingerprint = hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def __eq__(self, other) -> bool:
        return isinstance(other, Tokenizer) and other.fingerprint == self.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"

    def model_vocab_size(self, task: str) -> int:
        """Embedding rows a model of ``task`` needs: the vocabulary, and the mask id if it lies past it."""
        if task != "mlm":
            return self.vocab_size
        if self.mask_id is None:
            raise ValueError(f"tokenizer {self.name!r} has no {MASK} token, which task 'mlm' needs; use bytes, bpe:V or one with {MASK}")
        return max(self.vocab_size, self.mask_id + 1)

    # encoding -------------------------------------------------------------------------------
    def encode(self, data: bytes | str, progress: bool = False, source: str = "the data") -> torch.Tensor:
        """Token ids (1-D; uint8 for bytes, int32 otherwise). BPE reads UTF-8 text (ValueError naming ``source`` otherwise)."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if self.is_bytes:
            return as_tensor(raw)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"tokenizer {self.name!r} reads UTF-8 text; {source} has invalid UTF-8 at byte {error.start}: use --tokenizer bytes"
            ) from None
        lines = text.splitlines(keepends=True)
        parts = [np.zeros(0, dtype=np.int32)]
        bar = progress_bar(total=len(raw), unit="B", unit_scale=True, desc=f"tokenizing ({self.name})", disable=not progress)
        for start in range(0, len(lines), ENCODE_CHUNK):
            chunk = lines[start : start + ENCODE_CHUNK]
            parts += [np.asarray(ids, dtype=np.int32) for ids in self.encode_texts(chunk)]
            bar.update(sum(len(line.encode()) for line in chunk))
        bar.close()
        return torch.from_numpy(np.concatenate(parts))

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text (one call for all of them)."""
        if self.is_bytes:
            return [list(text.encode()) for text in texts]
        return [encoding.ids for encoding in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> bytes:
        """The bytes the ids stand for (special tokens stand for none), exact for any sequence."""
        return b"".join(self.token_bytes[int(index)] for index in ids)

    # files ----------------------------------------------------------------------------------
    def to_json(self) -> str:
        return self.backend.to_str()

    def save(self, path) -> Path:
        """Write ``tokenizer.json`` atomically (a directory gets the file inside it)."""
        path = Path(path)
        return write_text_atomic(path / TOKENIZER_FILE if path.is_dir() else path, self.to_json())

    @classmethod
    def load(cls, path) -> Tokenizer:
        """A saved tokenizer: ``tokenizer.json`` or a directory holding one."""
        path = Path(path)
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"tokenizer: {str(file)!r} does not exist; give bytes, bpe:VOCAB or a tokenizer.json file")
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"tokenizer: {str(file)!r} is not a tokenizers JSON file: {error}") from None
        return cls.from_json(text, str(file))

    @classmethod
    def from_json(cls, text: str, source: str) -> Tokenizer:
        """A tokenizer from the JSON of a ``tokenizer.json``; ValueError naming ``source`` when it is not one."""
        try:
            backend = Backend.from_str(text)
        except Exception as error:  # the library raises a bare Exception for malformed files
            raise ValueError(f"tokenizer: {source!r} is not a tokenizers JSON file: {error}") from None
        return cls(backend, source)


@functools.cache
def byte_tokenizer() -> Tokenizer:
    """Ids = bytes, as a BPE without merges over the byte-level alphabet (so it saves as a
    ``tokenizer.json`` any ``tokenizers`` user can load, with the same ids)."""
    vocab = {char: byte for byte, char in byte_alphabet().items()}
    return Tokenizer(_byte_level(Backend(models.BPE(vocab=vocab, merges=[]))), BYTES)


def train_bpe(text: bytes, vocab_size: int, progress: bool = False, source: str = "the training split") -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` entries (special tokens and the 256 bytes included) learnt from ``text``
    (UTF-8; ValueError naming ``source`` otherwise)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_BPE_VOCAB:
        raise ValueError(f"bpe vocabulary must be an integer >= {MIN_BPE_VOCAB} (special tokens and the 256 bytes), got {vocab_size!r}")
    try:
        lines = text.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError as error:
        raise ValueError(f"a BPE learns from UTF-8 text; {source} has invalid UTF-8 at byte {error.start}") from None
    backend = _byte_level(Backend(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    backend.train_from_iterator(lines, trainer, length=len(lines))
    return Tokenizer(backend, f"{BPE_PREFIX}{vocab_size}")


def parse_tokenizer_spec(spec: str) -> tuple[str, int | str | None]:
    """``("bytes", None)``, ``("bpe", V)`` or ``("file", PATH)`` (read, and checked, when loaded);
    ValueError for a malformed spec."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"tokenizer must be bytes, bpe:VOCAB or a tokenizer.json path, got {spec!r}")
    if spec == BYTES:
        return BYTES, None
    if spec.startswith(BPE_PREFIX):
        size = spec[len(BPE_PREFIX) :]
        if not size.isdigit() or int(size) < MIN_BPE_VOCAB:
            raise ValueError(f"tokenizer bpe:VOCAB needs an integer VOCAB >= {MIN_BPE_VOCAB}, got {spec!r}")
        return "bpe", int(size)
    return "file", str(Path(spec).expanduser())
