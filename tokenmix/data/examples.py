"""Labelled examples of varying length for classification tasks (ListOps, the LRA tasks).

An ``Examples`` split stores its token sequences end to end in one 1-D tensor with offsets, so
96,000 ListOps expressions or 25,000 IMDB reviews take one allocation and no padding. A
``ClassificationData`` is three such splits with the task's vocabulary, class count, and, for
pixel tasks, the image grid. Retrieval (two documents per example) stores ``documents=2``
sequences per example, one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .corpus import SPLITS
from .tokenizer import Tokenizer


def _concatenate(sequences) -> np.ndarray:
    """The sequences end to end: one join for bytes objects, one concatenation otherwise."""
    if all(isinstance(sequence, (bytes, bytearray)) for sequence in sequences):
        return np.frombuffer(b"".join(sequences), dtype=np.uint8).copy()
    parts = [np.asarray(sequence, dtype=np.int64).reshape(-1) for sequence in sequences]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _labels(labels) -> torch.Tensor:
    """Class ids as int64; scores (a float tensor: STS-B) kept as float32."""
    labels = torch.as_tensor(labels)
    return labels.float() if labels.is_floating_point() else labels.long()


@dataclass
class Examples:
    """``count`` labelled examples; document ``j`` of example ``i`` is ``tokens[offsets[k]:offsets[k + 1]]``
    with ``k = i * documents + j``."""

    tokens: torch.Tensor  # 1-D integer tensor, every sequence end to end
    offsets: torch.Tensor  # (count * documents + 1,) int64, starting at 0
    labels: torch.Tensor  # (count,) int64 class ids, or float32 scores (regression)
    documents: int = 1

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]], labels: Sequence[int], documents: int = 1, dtype=torch.int16) -> Examples:
        """From ``documents`` sequences per example, in example order: bytes objects, 1-D arrays or lists of ints."""
        if len(sequences) != len(labels) * documents:
            raise ValueError(f"{len(labels)} labels need {len(labels) * documents} sequences, got {len(sequences)}")
        lengths = torch.tensor([len(sequence) for sequence in sequences], dtype=torch.int64)
        offsets = torch.zeros(len(sequences) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        return cls(torch.from_numpy(_concatenate(sequences)).to(dtype), offsets, _labels(labels), documents)

    @classmethod
    def from_array(cls, array: np.ndarray, labels: Sequence[int], dtype=torch.uint8) -> Examples:
        """From an (count, length) array of equal-length sequences (pixel tasks), without copying them one by one."""
        count, length = array.shape
        offsets = torch.arange(count + 1, dtype=torch.int64) * length
        return cls(torch.from_numpy(np.ascontiguousarray(array).reshape(-1)).to(dtype), offsets, torch.as_tensor(labels, dtype=torch.int64))

    def __len__(self) -> int:
        return self.labels.numel()

    def lengths(self) -> torch.Tensor:
        """(count, documents) sequence lengths."""
        return (self.offsets[1:] - self.offsets[:-1]).view(-1, self.documents)

    def sequence(self, index: int, document: int = 0) -> torch.Tensor:
        k = index * self.documents + document
        return self.tokens[self.offsets[k] : self.offsets[k + 1]]

    def subset(self, indices: torch.Tensor) -> Examples:
        """The examples at ``indices`` (copied), in that order."""
        rows = (indices[:, None] * self.documents + torch.arange(self.documents)).flatten()
        sequences = [self.tokens[self.offsets[k] : self.offsets[k + 1]] for k in rows.tolist()]
        lengths = torch.tensor([len(s) for s in sequences], dtype=torch.int64)
        offsets = torch.zeros(len(sequences) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        tokens = torch.cat(sequences) if sequences else self.tokens[:0].clone()
        return Examples(tokens, offsets, self.labels[indices].clone(), self.documents)

    def batch(self, indices: Sequence[int] | torch.Tensor, length: int | None = None, multiple: int = 1):
        """(tokens, mask, labels) of the examples at ``indices``, right-padded with 0 to the longest
        rounded up to a ``multiple`` (or to ``length``): tokens (batch, L) int64, or (batch,
        documents, L) when ``documents > 1``; mask True at real tokens."""
        indices = torch.as_tensor(indices, dtype=torch.int64)
        rows = (indices[:, None] * self.documents + torch.arange(self.documents)).flatten()
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        longest = int((ends - starts).max()) if rows.numel() else 0
        width = -(-longest // multiple) * multiple if length is None else length
        if width < longest:
            raise ValueError(f"length={length} is shorter than the longest example in the batch ({longest} tokens)")
        positions = torch.arange(width)
        mask = positions[None, :] < (ends - starts)[:, None]
        gather = (starts[:, None] + positions[None, :]).clamp_max(max(self.tokens.numel() - 1, 0))
        tokens = torch.where(mask, self.tokens[gather].long(), 0) if self.tokens.numel() else torch.zeros_like(mask, dtype=torch.long)
        shape = (len(indices), self.documents, width) if self.documents > 1 else (len(indices), width)
        return tokens.view(shape), mask.view(shape), self.labels[indices]


@dataclass
class ClassificationData:
    """A classification task: three splits, the vocabulary (token ids in [0, vocab_size)) and classes.

    ``grid`` = (H, W) when every sequence is an H x W image read row by row (2-D mixers use it).
    Text tasks keep their ``tokenizer``; GLUE tasks name themselves in ``glue_task`` (their metric),
    and ``num_classes == 1`` means a score to regress (STS-B).
    """

    source: str
    vocab_size: int
    num_classes: int
    train: Examples
    val: Examples
    test: Examples
    grid: tuple[int, int] | None = None
    tokenizer: Tokenizer | None = None
    glue_task: str | None = None

    def split(self, name: str) -> Examples:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {name!r}")
        return getattr(self, name)

    @property
    def documents(self) -> int:
        return self.train.documents

    def majority_accuracy(self, split: str = "test") -> float:
        """Accuracy of always answering the most frequent training label (the floor a model must beat)."""
        majority = int(torch.bincount(self.train.labels, minlength=self.num_classes).argmax())
        labels = self.split(split).labels
        return float((labels == majority).float().mean()) if labels.numel() else 0.0
