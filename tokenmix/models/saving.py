"""Writing a model directory: ``model.safetensors`` (weights) and ``config.json`` (the resolved config),
each atomically; ``pretrained`` reads them back."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_model
from torch import nn

from ..files import atomic_write, write_text_atomic

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_pretrained(model: nn.Module, directory) -> None:
    """Write ``model``'s weights, then its ``config``, each atomically (temporary file, then rename)."""
    directory = Path(directory)
    atomic_write(directory / WEIGHTS_FILE, lambda temporary: save_model(model, str(temporary)))
    write_text_atomic(directory / CONFIG_FILE, model.config.to_json())
