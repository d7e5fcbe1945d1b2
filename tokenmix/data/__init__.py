"""Corpora and batch construction."""

from .batches import StreamBatches, contiguous_windows, lm_batch, mask_tokens, mlm_batch, random_windows, step_generator, step_seed
from .corpus import BYTE_VOCAB, SPLITS, ByteCorpus, load_corpus

__all__ = [
    "BYTE_VOCAB",
    "SPLITS",
    "StreamBatches",
    "ByteCorpus",
    "contiguous_windows",
    "lm_batch",
    "load_corpus",
    "mask_tokens",
    "mlm_batch",
    "random_windows",
    "step_generator",
    "step_seed",
]
