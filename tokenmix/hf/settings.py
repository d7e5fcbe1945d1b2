"""What an export's transformers files must hold, checked before transformers reads them.

transformers takes many damaged values without a word and fails later, deep in ``generate()`` or
a tokenizer call (a string token id, zero beams, a padding side of "middle", an unknown dtype).
``check_export`` reads the keys tokenmix writes, and the generation and tokenizer settings users
commonly edit, by kind; other keys transformers knows are left to it. Each problem is a
ValueError naming the file and the key.
"""

from __future__ import annotations

from pathlib import Path

from transformers import GenerationConfig

from ..data.tokenizer import Tokenizer
from ..models.config import ModelConfig

ARCHITECTURES = {"lm": "TokenmixForCausalLM", "mlm": "TokenmixForMaskedLM", "classify": "TokenmixForSequenceClassification"}
DTYPES = ("float32", "float16", "bfloat16", "float64")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
SIDES = ("left", "right")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
FLAGS = ("use_cache", "tie_word_embeddings", "do_sample", "output_attentions", "output_hidden_states", "output_scores")
FLAGS += ("return_dict_in_generate", "_from_model_config", "early_stopping", "renormalize_logits", "remove_invalid_values")
COUNTS = {"max_length": 1, "max_new_tokens": 1, "min_length": 0, "min_new_tokens": 0, "num_beams": 1, "num_return_sequences": 1}
COUNTS |= {"top_k": 0, "no_repeat_ngram_size": 0, "model_max_length": 1, "segment_length": 1, "num_labels": 1}
NUMBERS = {"temperature": (0, None), "top_p": (0, 1), "min_p": (0, 1), "typical_p": (0, 1), "repetition_penalty": (0, None)}
TEXTS = ("transformers_version", "tokenizer_class", "backend", "model_type")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _problem(key: str, value, vocab_size: int) -> str | None:
    """What is wrong with ``value`` at ``key`` (a key of the kinds above), or None."""
    if value is None:
        return None
    if key in TOKEN_IDS:
        ids = value if isinstance(value, list) and key == "eos_token_id" else [value]
        return None if ids and all(_is_int(i) and 0 <= i < vocab_size for i in ids) else f"a token id in [0, {vocab_size}) or null"
    if key in FLAGS:
        return None if isinstance(value, bool) else "true or false"
    if key in COUNTS:
        return None if _is_int(value) and value >= COUNTS[key] else f"an integer >= {COUNTS[key]}"
    if key in NUMBERS:
        low, high = NUMBERS[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if number and low <= value and (high is None or value <= high) else f"a number in [{low}, {high or 'inf'}]"
    if key in TEXTS:
        return None if isinstance(value, str) else "a string"
    return None


def _check(path: Path, data: dict, vocab_size: int) -> None:
    for key, value in data.items():
        problem = _problem(key, value, vocab_size)
        if problem:
            raise ValueError(f"{str(path)!r}: {key} must be {problem}, got {value!r:.60}")


def check_config(path: Path, data: dict, config: ModelConfig) -> None:
    """The transformers keys of an export's ``config.json`` (the tokenmix config under "tokenmix" is read by ``read_saved``)."""
    _check(path, data, config.vocab_size)
    if data.get("architectures") != [ARCHITECTURES[config.task]]:
        raise ValueError(f"{str(path)!r}: architectures must be [{ARCHITECTURES[config.task]!r}] for task {config.task!r}")
    for key in ("dtype", "torch_dtype"):
        if data.get(key) is not None and data[key] not in DTYPES:
            raise ValueError(f"{str(path)!r}: {key} must be one of {list(DTYPES)}, got {data[key]!r:.60}")
    for key, value in (("hidden_size", config.dim), ("vocab_size", config.vocab_size)):
        if data.get(key) is not None and data[key] != value:
            raise ValueError(f"{str(path)!r}: {key} is {data[key]!r:.60} but the tokenmix config's is {value}")
    for key in ("id2label", "label2id"):
        if key in data and not isinstance(data[key], dict):
            raise ValueError(f"{str(path)!r}: {key} must be an object, got {data[key]!r:.60}")


def check_generation(path: Path, data: dict, vocab_size: int) -> None:
    """``generation_config.json``: settings ``GenerationConfig`` knows, each of its kind."""
    known = GenerationConfig()
    unknown = sorted(key for key in data if not hasattr(known, key))
    if unknown:
        raise ValueError(f"{str(path)!r}: {unknown} are not generation settings transformers knows")
    _check(path, data, vocab_size)


def check_tokenizer_settings(path: Path, data: dict, tokenizer: Tokenizer) -> None:
    """``tokenizer_config.json``: sides, lengths and special tokens that name tokens of ``tokenizer``."""
    _check(path, data, tokenizer.vocab_size)
    for key in ("padding_side", "truncation_side"):
        if key in data and data[key] not in SIDES:
            raise ValueError(f"{str(path)!r}: {key} must be 'left' or 'right', got {data[key]!r:.60}")
    tokens = tokenizer.backend.get_vocab(with_added_tokens=True)
    for key in SPECIAL_TOKENS:
        value = data.get(key)
        content = value.get("content") if isinstance(value, dict) else value
        if value is not None and not (isinstance(content, str) and content in tokens):
            raise ValueError(f"{str(path)!r}: {key} must name a token of tokenizer.json, got {value!r:.60}")
