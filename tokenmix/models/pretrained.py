"""save_pretrained / from_pretrained: ``config.json`` + ``model.safetensors`` in a directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import load_model, save_model

from .config import ModelConfig
from .model import SequenceModel

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_pretrained(model: SequenceModel, directory) -> None:
    """Write config and weights atomically (temporary files, then rename)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / (WEIGHTS_FILE + ".tmp")
    save_model(model, str(temporary))
    os.replace(temporary, directory / WEIGHTS_FILE)
    temporary = directory / (CONFIG_FILE + ".tmp")
    temporary.write_text(model.config.to_json())
    os.replace(temporary, directory / CONFIG_FILE)


def from_pretrained(directory, device=None) -> SequenceModel:
    """Rebuild a model saved by ``save_pretrained``."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise ValueError(f"directory {str(directory)!r} has no {name}: not a save_pretrained directory")
    config = ModelConfig.from_dict(json.loads((directory / CONFIG_FILE).read_text()))
    model = SequenceModel(config)
    load_model(model, str(directory / WEIGHTS_FILE), device=str(device or "cpu"))
    return model
