"""Corpora and tokenizers, generated tasks, the Long Range Arena and GLUE files, and batch construction."""

from .batches import StreamBatches, contiguous_windows, lm_batch, mask_tokens, mlm_batch, random_windows, step_generator, step_seed
from .corpus import BYTE_VOCAB, SPLITS, ByteCorpus, load_corpus
from .examples import ClassificationData, Examples
from .listops import ListOpsOptions, generate_listops, listops_examples, load_listops, read_listops
from .lra_image import load_lra_image
from .lra_pathfinder import load_lra_pathfinder
from .lra_retrieval import load_lra_retrieval
from .lra_text import load_lra_text
from .recall import AssociativeRecall, recall_examples
from .shapes import load_shapes
from .sources import load_data
from .tokenized import TokenCorpus, resolve_tokenizer, tokenize_corpus
from .tokenizer import Tokenizer, byte_tokenizer, train_bpe
from .wikitext import load_wikitext

__all__ = [
    "AssociativeRecall",
    "BYTE_VOCAB",
    "ByteCorpus",
    "ClassificationData",
    "Examples",
    "ListOpsOptions",
    "SPLITS",
    "StreamBatches",
    "TokenCorpus",
    "Tokenizer",
    "byte_tokenizer",
    "resolve_tokenizer",
    "tokenize_corpus",
    "train_bpe",
    "contiguous_windows",
    "generate_listops",
    "listops_examples",
    "lm_batch",
    "load_corpus",
    "load_data",
    "load_listops",
    "load_lra_image",
    "load_lra_pathfinder",
    "load_shapes",
    "load_wikitext",
    "load_lra_retrieval",
    "load_lra_text",
    "mask_tokens",
    "mlm_batch",
    "random_windows",
    "read_listops",
    "recall_examples",
    "step_generator",
    "step_seed",
]
