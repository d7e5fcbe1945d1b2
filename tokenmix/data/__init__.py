"""Corpora and batch construction."""

from .batches import StreamBatches, contiguous_windows, lm_batch, mask_tokens, mlm_batch, random_windows, step_generator, step_seed
from .corpus import BYTE_VOCAB, SPLITS, ByteCorpus, load_corpus
from .recall import AssociativeRecall, recall_examples
from .sources import load_data

__all__ = [
    "AssociativeRecall",
    "BYTE_VOCAB",
    "SPLITS",
    "StreamBatches",
    "ByteCorpus",
    "contiguous_windows",
    "lm_batch",
    "load_corpus",
    "load_data",
    "mask_tokens",
    "mlm_batch",
    "random_windows",
    "recall_examples",
    "step_generator",
    "step_seed",
]
