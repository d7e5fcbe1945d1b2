"""A model folder: ``config.json`` + ``model.safetensors`` (``save_pretrained``), or a transformers export
(``tokenmix export-hf``: its config holds the tokenmix config under ``tokenmix``, its weights are prefixed
``tokenmix.``). Both files are data, never code; a damaged or edited file is a ValueError that names it."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..models.config import ModelConfig
from ..models.saving import CONFIG_FILE, WEIGHTS_FILE
from .migrations import read_model_config, with_segment_length
from .weights import check_fits, check_sizes, read_header, read_safetensors

HF_MODEL_TYPE = "tokenmix"  # transformers' model_type of tokenmix models, and the key of their tokenmix config
MODEL_FOLDER, EXPORT = "model folder", "transformers export"  # the two layouts


def read_json(path: Path, what: str):
    """The JSON value in ``path``; ValueError naming the file when it is unreadable or not JSON."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(path)!r} is not a readable {what} (JSON): {error}") from None


def is_model_folder(path: Path) -> bool:
    """Whether ``path`` is a folder meant as a model folder or export (it holds either of their files)."""
    return path.is_dir() and ((path / CONFIG_FILE).is_file() or (path / WEIGHTS_FILE).is_file())


def weights_source(directory: Path) -> str:
    """How errors name a model directory's weights and the config beside them."""
    return f"{str(directory / WEIGHTS_FILE)!r} (with {CONFIG_FILE} beside it)"


def read_model_folder(directory) -> tuple[ModelConfig, dict[str, torch.Tensor], str]:
    """(config, weights, layout: ``MODEL_FOLDER`` or ``EXPORT``) of a ``save_pretrained`` or transformers-export
    directory; ValueError naming the file that is missing, damaged or inconsistent. The config is checked
    against the weights' header (``check_sizes``, ``check_fits``) before the weights are read."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise ValueError(f"directory {str(directory)!r} has no {name}: not a save_pretrained directory")
    data = read_json(directory / CONFIG_FILE, "model config")
    transformers_layout = isinstance(data, dict) and data.get("model_type") == HF_MODEL_TYPE
    saved = data.get(HF_MODEL_TYPE) if transformers_layout else data

    def unprefixed(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {key.removeprefix(HF_MODEL_TYPE + "."): value for key, value in tensors.items()} if transformers_layout else tensors

    header = unprefixed(read_header(directory / WEIGHTS_FILE))
    check_sizes(saved, header, weights_source(directory))
    try:
        config = read_model_config(saved)
    except ValueError as error:
        raise ValueError(f"{str(directory / CONFIG_FILE)!r}: not a valid tokenmix model config: {error}") from None
    if transformers_layout:  # an export from before XL models recorded their segment kept it beside their config
        config = with_segment_length(config, saved, data.get("segment_length"))
    check_fits(config, header, weights_source(directory))
    return config, unprefixed(read_safetensors(directory / WEIGHTS_FILE)), EXPORT if transformers_layout else MODEL_FOLDER
