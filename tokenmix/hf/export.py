"""A tokenmix model (and its tokenizer) as a transformers directory: ``config.json``,
``model.safetensors`` (and ``generation_config.json`` for a causal LM), ``tokenizer.json`` and
``tokenizer_config.json``."""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer as Backend
from transformers import PreTrainedTokenizerFast

from ..data.tokenizer import MASK, Tokenizer
from ..io.files import atomic_folder, default_file_mode
from ..models.model import SequenceModel
from ..models.saving import CONFIG_FILE
from ..runs.folder import EXPORT, HF_MODEL_TYPE, read_json, read_model_folder
from ..runs.layout import CHECKPOINT_FILE
from . import settings
from .configuration import TokenmixConfig
from .modeling import TokenmixForCausalLM, TokenmixForMaskedLM, TokenmixForSequenceClassification

CLASSES = {"lm": TokenmixForCausalLM, "mlm": TokenmixForMaskedLM, "classify": TokenmixForSequenceClassification}
SETTINGS_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json")  # JSON objects transformers reads


def with_mask_token(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer with its mask as a token: bytes keep the mask past the 256 byte ids (id 256),
    which a tokenizer file can only name as an added special token."""
    if tokenizer.mask_id is None or tokenizer.mask_id < tokenizer.vocab_size:
        return tokenizer
    backend = Backend.from_str(tokenizer.to_json())
    backend.add_special_tokens([MASK])
    return Tokenizer(backend, tokenizer.source)


def _special(tokenizer: Tokenizer) -> dict[str, str]:
    """transformers' names of the tokenizer's special tokens (end of document, padding, mask)."""
    ids = {"eos_token": tokenizer.end_of_document_id, "pad_token": tokenizer.pad_id, "mask_token": tokenizer.mask_id}
    return {name: tokenizer.backend.id_to_token(index) for name, index in ids.items() if index is not None and index < tokenizer.vocab_size}


def hf_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """The tokenizer as a ``PreTrainedTokenizerFast`` (the same ids), padding on the left for generation."""
    tokenizer = with_mask_token(tokenizer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend, padding_side="left", **_special(tokenizer))


def export(model: SequenceModel, directory, tokenizer: Tokenizer | None = None, *, overwrite: bool = False) -> Path:
    """Write ``model`` (and ``tokenizer``) to ``directory`` for ``from_pretrained`` of transformers'
    Auto classes (after ``import tokenmix.hf``) and ``tokenmix.open_run``. A directory
    that holds files is refused unless ``overwrite``.
    """
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())) and not overwrite:
        raise ValueError(f"export: {str(directory)!r} already exists and is not an empty folder; choose another or pass overwrite=True")
    model_class = CLASSES[model.config.task]
    special = {} if tokenizer is None else _special(tokenizer)
    config = TokenmixConfig(
        tokenmix=model.config.to_dict(),
        architectures=[model_class.__name__],
        pad_token_id=tokenizer.pad_id if special.get("pad_token") else None,
        eos_token_id=tokenizer.end_of_document_id if special.get("eos_token") else None,
        **({"num_labels": model.config.num_classes} if model.config.task == "classify" else {}),
    )
    wrapped = model_class(config)
    wrapped.tokenmix.load_state_dict(model.state_dict())
    atomic_folder(directory, lambda folder: _write_export(wrapped, tokenizer, folder))
    return directory


def _write_export(wrapped, tokenizer: Tokenizer | None, folder: Path) -> None:
    wrapped.save_pretrained(folder)
    if tokenizer is not None:
        hf_tokenizer(tokenizer).save_pretrained(folder)
    for path in folder.iterdir():  # safetensors writes its files 0600: give them the mode the umask gives any file
        if path.is_file():
            os.chmod(path, default_file_mode())


def check_export(directory) -> None:
    """ValueError naming the file unless ``directory`` is an export transformers can read: its config,
    weights (consistent with each other), tokenizer and settings files. Read before transformers
    reads them, so a damaged file is a clear error rather than transformers' traceback."""
    directory = Path(directory)
    if (directory / CHECKPOINT_FILE).is_file():
        raise ValueError(
            f"{str(directory)!r} is a run directory; transformers reads a folder written by `tokenmix export-hf {directory} DIR`"
        )
    config, _, layout = read_model_folder(directory)
    if layout != EXPORT:
        raise ValueError(
            f"{str(directory / CONFIG_FILE)!r} has no model_type {HF_MODEL_TYPE!r}: a save_pretrained folder, not a transformers "
            "export; write one with `tokenmix export-hf`"
        )
    settings.check_config(directory / CONFIG_FILE, read_json(directory / CONFIG_FILE, "model config"), config)  # weights checked above
    files = {}
    for name in SETTINGS_FILES:
        if (directory / name).exists():
            files[name] = read_json(directory / name, "transformers settings file")
            if not isinstance(files[name], dict):
                raise ValueError(f"{str(directory / name)!r} must hold a JSON object")
    tokenizer = Tokenizer.load(directory)
    spelled = max((index for index, piece in enumerate(tokenizer.token_bytes) if piece), default=-1) + 1  # a byte LM's <mask> may lie past
    if spelled > config.vocab_size:
        file = directory / "tokenizer.json"
        raise ValueError(f"{str(file)!r} has {spelled} ids but the model {config.vocab_size}: not this model's tokenizer")
    if "generation_config.json" in files:
        settings.check_generation(directory / "generation_config.json", files["generation_config.json"], config.vocab_size)
    if "tokenizer_config.json" in files:
        settings.check_tokenizer_settings(directory / "tokenizer_config.json", files["tokenizer_config.json"], tokenizer)
