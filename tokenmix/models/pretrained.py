"""save_pretrained / from_pretrained: ``config.json`` + ``model.safetensors`` in a directory.

``from_pretrained`` also reads a directory written for transformers (``tokenmix.hf.export``,
``tokenmix export-hf``): its config holds the tokenmix config under ``tokenmix`` and its weights
are prefixed ``tokenmix.``. Both files are data (JSON and safetensors), never code; a damaged or
edited file is a ValueError that names it and says what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..devices import resolve_device
from .config import ModelConfig, with_segment_length
from .model import SequenceModel
from .saving import CONFIG_FILE, WEIGHTS_FILE

HF_MODEL_TYPE = "tokenmix"  # transformers' model_type of tokenmix models, and the key of their tokenmix config


def read_json(path: Path, what: str):
    """The JSON value in ``path``; ValueError naming the file when it is unreadable or not JSON."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(path)!r} is not a readable {what} (JSON): {error}") from None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; ValueError naming the file when it is missing or damaged."""
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise ValueError(f"{str(path)!r} is not a readable safetensors file: {error}") from None


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str, strict: bool = True) -> None:
    """Copy ``weights`` (read from ``source``) into ``model``, whose keys and shapes they must match
    (every key when ``strict``, else those ``weights`` has); ValueError naming ``source`` and the
    differences otherwise."""
    check_weights(model, weights, source, strict)
    model.load_state_dict(weights, strict=strict)


def check_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str, strict: bool = True) -> None:
    """ValueError naming ``source`` unless ``weights`` fit ``model`` as ``load_weights`` needs (a model
    on the meta device will do: only shapes and dtypes are compared)."""
    own = model.state_dict()
    missing = sorted(key for key in own if key not in weights) if strict else []
    unexpected = sorted(key for key in weights if key not in own)
    wrong = [
        f"{key} {tuple(weights[key].shape)} (model: {tuple(own[key].shape)})"
        for key in sorted(weights)
        if key in own and weights[key].shape != own[key].shape
    ]
    wrong += [
        f"{key} {weights[key].dtype}"
        for key in sorted(weights)
        if key in own and own[key].is_floating_point() and not weights[key].is_floating_point()
    ]
    if missing or unexpected or wrong:
        found = "; ".join(
            f"{label} {items[:4]}{' ...' if len(items) > 4 else ''}"
            for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape or type", wrong))
            if items
        )
        raise ValueError(f"{source}: its weights do not fit the model its config describes ({model.config.name}): {found}")


def read_saved(directory) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, weights) of a ``save_pretrained`` or transformers-export directory; ValueError naming
    the file that is missing, damaged or inconsistent."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise ValueError(f"directory {str(directory)!r} has no {name}: not a save_pretrained directory")
    data = read_json(directory / CONFIG_FILE, "model config")
    transformers_layout = isinstance(data, dict) and data.get("model_type") == HF_MODEL_TYPE
    try:
        config = ModelConfig.from_dict(data[HF_MODEL_TYPE] if transformers_layout else data)
    except (ValueError, KeyError) as error:
        raise ValueError(f"{str(directory / CONFIG_FILE)!r}: not a valid tokenmix model config: {error}") from None
    if transformers_layout:  # an export from before XL models recorded their segment kept it beside their config
        config = with_segment_length(config, data[HF_MODEL_TYPE], data.get("segment_length"))
    weights = read_weights(directory / WEIGHTS_FILE)
    if transformers_layout:
        weights = {key.removeprefix(HF_MODEL_TYPE + "."): value for key, value in weights.items()}
    return config, weights


def from_pretrained(directory, device=None, dtype: torch.dtype | None = None) -> SequenceModel:
    """Rebuild a model saved by ``save_pretrained``, on ``device`` (default CPU) in ``dtype`` (default as saved)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating point torch.dtype (torch.float32, torch.bfloat16, ...), got {dtype!r}")
    config, weights = read_saved(directory)
    model = SequenceModel(config)
    saved = next((tensor.dtype for tensor in weights.values() if tensor.is_floating_point()), None)
    model.to(dtype=saved)  # the saved precision unless ``dtype`` says otherwise
    load_weights(model, weights, f"{str(Path(directory) / WEIGHTS_FILE)!r} (with {CONFIG_FILE} beside it)")
    return model.to(device=resolve_device(device or "cpu"), dtype=dtype)
