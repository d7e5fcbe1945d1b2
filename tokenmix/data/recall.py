"""Associative recall (Ba et al. 2016; the H3/Hyena synthetic suite; TCNCA, Terzić et al. 2023, §3, Appendix G).

Vocabulary of V tokens: 0 is a no-op (filler), 1 the query marker, the next (V - 2) // 2 are keys
and the rest values. Every example draws a fresh key -> value map, writes (L - 2) // 2 random
"key value" pairs (one leading no-op when L is odd), then the query marker, a key that occurred,
and that key's value: L + 1 tokens. The model reads tokens[:-1] (length L) and is trained to
predict tokens[1:]; accuracy counts the last position only, the recalled value.

``pairs=K`` writes K pairs first and no-ops from them to the query instead: the answer then lies
L - 2K - 2 tokens or more before it, across every shard boundary when a long sequence is split over
processes (``--context-parallel``), e.g. ``--data assoc-recall:vocab=20,pairs=16 --seq-len 65536``.

Training examples are fresh every step (seeded by (seed, step)); validation and test are fixed
sets per seed. ``--data assoc-recall`` uses V = 10; ``--data assoc-recall:vocab=20`` sets V.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..validation import check_int
from .batches import step_generator

PREFIX = "assoc-recall"
NO_OP, QUERY = 0, 1
EVAL_EXAMPLES = 1000
_SPLIT_STEPS = {"val": -1, "test": -2}  # generator streams apart from every training step


def recall_examples(count: int, vocab_size: int, length: int, generator: torch.Generator, pairs: int | None = None) -> torch.Tensor:
    """(count, length + 1) int64 examples; see the module docstring (``pairs`` None: as many as fit)."""
    keys = (vocab_size - 2) // 2
    values = vocab_size - 2 - keys
    written = (length - 2) // 2 if pairs is None else pairs
    mapping = torch.randint(values, (count, keys), generator=generator) + 2 + keys
    drawn = torch.randint(keys, (count, written), generator=generator)
    body = torch.stack([drawn + 2, mapping.gather(1, drawn)], dim=2).flatten(1)
    asked = drawn.gather(1, torch.randint(written, (count, 1), generator=generator))
    filler = torch.full((count, length - 2 - 2 * written), NO_OP)
    query = torch.cat([torch.full((count, 1), QUERY), asked + 2, mapping.gather(1, asked)], dim=1)
    parts = [filler, body] if pairs is None else [body, filler]
    return torch.cat([*parts, query], dim=1)


@dataclass
class AssociativeRecall:
    """The task at vocabulary ``vocab_size`` and input length ``length``."""

    vocab_size: int = 10
    length: int = 64
    seed: int = 0
    eval_examples: int = EVAL_EXAMPLES
    pairs: int | None = None

    def __post_init__(self):
        check_int(self.vocab_size, "assoc-recall vocab", minimum=4)
        check_int(self.length, "assoc-recall length (--seq-len)", minimum=4)
        if self.pairs is not None:
            most = (self.length - 2) // 2
            check_int(self.pairs, f"assoc-recall pairs (at most (--seq-len - 2) // 2 = {most})", 1, most)

    @property
    def source(self) -> str:
        return f"{PREFIX}:vocab={self.vocab_size}" + ("" if self.pairs is None else f",pairs={self.pairs}")

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch, L): next-token prediction on fresh examples."""
        tokens = recall_examples(batch_size, self.vocab_size, self.length, generator, self.pairs)
        return tokens[:, :-1], tokens[:, 1:]

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed validation or test set of ``eval_examples`` examples, as (inputs, targets)."""
        if name not in _SPLIT_STEPS:
            raise ValueError(f"split must be one of {list(_SPLIT_STEPS)} for {PREFIX}, got {name!r}")
        generator = step_generator(self.seed, _SPLIT_STEPS[name])
        tokens = recall_examples(self.eval_examples, self.vocab_size, self.length, generator, self.pairs)
        return tokens[:, :-1], tokens[:, 1:]


def parse_recall(source: str, length: int, seed: int = 0) -> AssociativeRecall | None:
    """``assoc-recall``, ``assoc-recall:vocab=V``, ``assoc-recall:vocab=V,pairs=K`` -> the task; None for any other data source."""
    if source != PREFIX and not source.startswith(PREFIX + ":"):
        return None
    settings = {"vocab": 10, "pairs": None}
    for item in filter(None, source[len(PREFIX) + 1 :].split(",")):
        key, _, value = item.partition("=")
        if key not in settings or not value.isdigit():
            raise ValueError(f"data {source!r}: the accepted form is {PREFIX}[:vocab=V][,pairs=K] (V >= 4, K >= 1)")
        settings[key] = int(value)
    return AssociativeRecall(settings["vocab"], length, seed, pairs=settings["pairs"])
