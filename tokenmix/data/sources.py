"""The ``--data`` argument: a byte corpus (``corpus.py``) or the associative-recall task (``recall.py``)."""

from __future__ import annotations

from .corpus import ByteCorpus, load_corpus
from .recall import AssociativeRecall, parse_recall

DataSource = ByteCorpus | AssociativeRecall


def load_data(source: str, length: int, seed: int = 0) -> DataSource:
    """Load ``--data``; ``length`` and ``seed`` shape the synthetic task (the corpora ignore them)."""
    return parse_recall(source, length, seed) or load_corpus(source)
