"""Writing a model directory: ``model.safetensors`` (weights) and ``config.json`` (the resolved config),
each atomically; ``tokenmix.runs.open_run`` reads them back."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file, save_model
from torch import nn

from ..io.files import atomic_write, write_text_atomic

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def tensor_bytes(value) -> int:
    """The bytes of the tensors in ``value`` (nested dicts, lists and tuples): what a save needs at least."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, dict):
        return sum(map(tensor_bytes, value.values()))
    if isinstance(value, (list, tuple)):
        return sum(map(tensor_bytes, value))
    return 0


def save_pretrained(model: nn.Module, directory, weights: dict[str, torch.Tensor] | None = None) -> None:
    """Write ``model``'s weights, then its ``config``, each atomically (temporary file, then rename);
    ``weights``: its whole state dict where the model holds a shard of it (FSDP, ``parallel.fsdp.full_state_dict``)."""
    directory = Path(directory)
    if weights is None:
        size = tensor_bytes(model.state_dict())
        atomic_write(directory / WEIGHTS_FILE, lambda temporary: save_model(model, str(temporary)), size)
    else:
        whole = {key: value.contiguous() for key, value in weights.items()}
        atomic_write(directory / WEIGHTS_FILE, lambda temporary: save_file(whole, str(temporary)), tensor_bytes(whole))
    write_text_atomic(directory / CONFIG_FILE, model.config.to_json())
