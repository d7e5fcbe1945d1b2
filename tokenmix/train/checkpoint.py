"""Training checkpoints: one file, written atomically (temporary file, then rename)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from ..files import atomic_write

CHECKPOINT_FILE = "checkpoint.pt"


def save_checkpoint(path, state: dict) -> None:
    """Write atomically: a kill during the save leaves the previous checkpoint (and a stale .tmp)."""
    atomic_write(path, lambda temporary: torch.save(state, temporary))


def resolve_checkpoint(path) -> Path:
    """A checkpoint file, or a run directory holding ``checkpoint.pt``."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist (give a checkpoint file or a run directory)")
    return path


def load_checkpoint(path) -> dict:
    path = resolve_checkpoint(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # corrupt or foreign file
        raise ValueError(f"checkpoint {str(path)!r} is unreadable: {error}") from None
    for key in ("model_config", "train_config", "model", "step"):
        if key not in state:
            raise ValueError(f"checkpoint {str(path)!r} lacks {key!r}: not a tokenmix training checkpoint")
    return state


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def checkpoint_tokenizer(state: dict):
    """The tokenizer a checkpoint was trained with (its JSON is kept in it); bytes for text corpora
    of runs written before tokenizers, None for data with ids of its own (ListOps, LRA, recall)."""
    from ..data.sources import source_kind
    from ..data.tokenizer import Tokenizer, byte_tokenizer

    if state.get("tokenizer") is not None:
        return Tokenizer.from_json(state["tokenizer"], "the checkpoint")
    written_before_tokenizers = "tokenizer" not in state
    return byte_tokenizer() if written_before_tokenizers and source_kind(state["train_config"]["data"]) == "corpus" else None


def model_from_checkpoint(path, device="cpu"):
    """(model, train_config dict, tokenizer or None) from a training checkpoint file or run directory."""
    from ..devices import resolve_device
    from ..models.config import ModelConfig
    from ..models.model import SequenceModel

    state = load_checkpoint(path)
    model = SequenceModel(ModelConfig.from_dict(state["model_config"]))
    model.load_state_dict(state["model"])
    return model.to(resolve_device(device)).eval(), state["train_config"], checkpoint_tokenizer(state)
