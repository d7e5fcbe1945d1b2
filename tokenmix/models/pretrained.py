"""save_pretrained / from_pretrained: ``config.json`` + ``model.safetensors`` in a directory.

``from_pretrained`` also reads a directory written for transformers (``tokenmix.hf.export``,
``tokenmix export-hf``): its config holds the tokenmix config under ``tokenmix`` and its weights
are prefixed ``tokenmix.``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from ..devices import resolve_device
from ..files import atomic_write, write_text_atomic
from .config import ModelConfig
from .model import SequenceModel

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HF_MODEL_TYPE = "tokenmix"  # transformers' model_type of tokenmix models, and the key of their tokenmix config


def save_pretrained(model: SequenceModel, directory) -> None:
    """Write weights, then config, each atomically (temporary file, then rename)."""
    directory = Path(directory)
    atomic_write(directory / WEIGHTS_FILE, lambda temporary: save_model(model, str(temporary)))
    write_text_atomic(directory / CONFIG_FILE, model.config.to_json())


def from_pretrained(directory, device=None, dtype: torch.dtype | None = None) -> SequenceModel:
    """Rebuild a model saved by ``save_pretrained``, on ``device`` (default CPU) in ``dtype`` (default as saved)."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise ValueError(f"directory {str(directory)!r} has no {name}: not a save_pretrained directory")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating point torch.dtype (torch.float32, torch.bfloat16, ...), got {dtype!r}")
    try:
        data = json.loads((directory / CONFIG_FILE).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{str(directory / CONFIG_FILE)!r} is not valid JSON: {error}") from None
    transformers_layout = isinstance(data, dict) and data.get("model_type") == HF_MODEL_TYPE
    model = SequenceModel(ModelConfig.from_dict(data[HF_MODEL_TYPE] if transformers_layout else data))
    weights = load_file(str(directory / WEIGHTS_FILE))
    if transformers_layout:
        weights = {key.removeprefix(HF_MODEL_TYPE + "."): value for key, value in weights.items()}
    saved = next((tensor.dtype for tensor in weights.values() if tensor.is_floating_point()), None)
    model.to(dtype=saved)  # the saved precision unless ``dtype`` says otherwise
    model.load_state_dict(weights)
    return model.to(device=resolve_device(device or "cpu"), dtype=dtype)
