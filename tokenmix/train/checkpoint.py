"""Training checkpoints: one file of tensors and plain containers, written atomically, read without running code.

A checkpoint is a dict that ``torch.load(..., weights_only=True)`` reads: tensors, numbers,
strings, lists and dicts. Unpickling a Python object can call any function the file names, so a
checkpoint holds none: RNG states are stored as tensors and numbers, streaming states as plain
dicts (``StreamState.to_plain``), configs as dicts, the tokenizer as its JSON. PyTorch itself has
loaded with ``weights_only=True`` by default since 2.6 for this reason.

Checkpoints of tokenmix 0.2 and earlier (format 1, no ``checkpoint_format`` key) pickled numpy's
RNG state and the XL memories as objects. They are refused with the one command that converts
them, ``tokenmix convert-checkpoint PATH --trust`` (``legacy_checkpoint.py``), which unpickles the
file once, after its user says they trust where it came from.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import torch

from ..files import atomic_write

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_KEY = "checkpoint_format"
CHECKPOINT_FORMAT = 2
# The keys every checkpoint has, with their types (others, such as the optimizer's, are checked where they are read).
REQUIRED_KEYS = {"model_config": dict, "train_config": dict, "model": dict, "step": int}
RESUME_KEYS = {"optimizer": dict, "scheduler": dict, "rng": dict}  # and what a resume reads besides


def save_checkpoint(path, state: dict) -> None:
    """Write atomically: a kill during the save leaves the previous checkpoint (and a stale .tmp)."""
    atomic_write(path, lambda temporary: torch.save({**state, FORMAT_KEY: CHECKPOINT_FORMAT}, temporary))


def resolve_checkpoint(path) -> Path:
    """A checkpoint file, or a run directory holding ``checkpoint.pt``."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist (give a checkpoint file or a run directory)")
    return path


def untrusted_pickle_message(path: Path) -> str:
    return (
        f"checkpoint {str(path)!r} holds pickled Python objects, which loading would run as code (a checkpoint of tokenmix 0.2 "
        "or earlier, or a file made to run code): it is not loaded. If you trust where it came from, convert it once with: "
        f"tokenmix convert-checkpoint {path} --trust"
    )


def load_checkpoint(path) -> dict:
    """The checkpoint at ``path`` (a file or run directory), read with ``weights_only=True``.

    ValueError naming the file: unreadable, not a tokenmix checkpoint, written by a newer
    tokenmix, or holding pickled objects (an older checkpoint, refused with the command that
    converts it).
    """
    path = resolve_checkpoint(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" in str(error):
            raise ValueError(untrusted_pickle_message(path)) from None
        raise ValueError(f"checkpoint {str(path)!r} is unreadable: {_first_line(error)}") from None
    except Exception as error:  # truncated, empty or foreign files: torch raises RuntimeError, EOFError, ...
        raise ValueError(f"checkpoint {str(path)!r} is unreadable: {_first_line(error)}") from None
    check_checkpoint(state, path)
    return state


def check_checkpoint(state, path) -> None:
    """ValueError naming ``path`` unless ``state`` has the format and the keys of a tokenmix checkpoint."""
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(state).__name__}, not a tokenmix training checkpoint")
    written = state.get(FORMAT_KEY)
    if written is None:
        raise ValueError(f"checkpoint {str(path)!r} has no {FORMAT_KEY!r}: not a tokenmix training checkpoint")
    if not isinstance(written, int) or isinstance(written, bool) or written > CHECKPOINT_FORMAT:
        raise ValueError(
            f"checkpoint {str(path)!r} is of format {written!r}, newer than this tokenmix reads ({CHECKPOINT_FORMAT}): upgrade tokenmix"
        )
    _check_keys(state, REQUIRED_KEYS, path)
    bad = sorted(key for key, value in state["model"].items() if not isinstance(value, torch.Tensor))
    if bad:
        raise ValueError(f"checkpoint {str(path)!r}: the model's weights must be tensors; {bad[:3]} are not")
    if state.get("tokenizer") is not None and not isinstance(state["tokenizer"], str):
        kind = type(state["tokenizer"]).__name__
        raise ValueError(f"checkpoint {str(path)!r}: 'tokenizer' must be the tokenizer's JSON text, got {kind}")


def _check_keys(state: dict, kinds: dict, path) -> None:
    for key, kind in kinds.items():
        if key not in state:
            raise ValueError(f"checkpoint {str(path)!r} lacks {key!r}: not a tokenmix training checkpoint")
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise ValueError(f"checkpoint {str(path)!r}: {key!r} must be a {kind.__name__}, got {type(state[key]).__name__}")


def check_resumable(state: dict, path) -> None:
    """ValueError naming ``path`` unless the checkpoint holds what a resume reads besides the model."""
    _check_keys(state, RESUME_KEYS, path)
    total = state.get("total_steps")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
        raise ValueError(f"checkpoint {str(path)!r}: 'total_steps' must be an int or None, got {type(total).__name__}")
    files = state.get("data_files")
    if files is not None and not (isinstance(files, dict) and all(isinstance(entry, dict) for entry in files.values())):
        raise ValueError(f"checkpoint {str(path)!r}: 'data_files' must map file names to their sizes and digests")
    segments = state.get("segment_states")
    if segments is not None and not isinstance(segments, list):
        raise ValueError(f"checkpoint {str(path)!r}: 'segment_states' must be a list, got {type(segments).__name__}")


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def rng_state() -> dict:
    """torch's, numpy's and Python's global RNG states as tensors and plain numbers."""
    _, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": position, "has_gauss": has_gauss, "cached": cached_gaussian},
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }


def restore_rng_state(state: dict, path) -> None:
    """Set the RNG states ``rng_state`` returned; ValueError naming ``path`` for a malformed entry."""
    try:
        numpy_state, python_state = state["numpy"], state["python"]
        keys = numpy_state["keys"].numpy().astype(np.uint32)
        numpy_tuple = ("MT19937", keys, int(numpy_state["position"]), int(numpy_state["has_gauss"]), float(numpy_state["cached"]))
        python_tuple = (python_state["version"], tuple(python_state["internal"]), python_state["gauss_next"])
        torch.set_rng_state(state["torch"])
        np.random.set_state(numpy_tuple)
        random.setstate(python_tuple)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as error:
        raise ValueError(f"checkpoint {str(path)!r}: its RNG state is malformed ({_first_line(error)})") from None


def checkpoint_tokenizer(state: dict, path="the checkpoint"):
    """The tokenizer a checkpoint was trained with (its JSON is kept in it); None for data with ids
    of its own (ListOps, LRA, recall)."""
    from ..data.tokenizer import Tokenizer

    return None if state.get("tokenizer") is None else Tokenizer.from_json(state["tokenizer"], f"{path} (its tokenizer)")


def model_from_checkpoint(path, device="cpu"):
    """(model, train_config dict, tokenizer or None) from a training checkpoint file or run directory.

    A run directory's ``tokenizer.json`` must be the tokenizer the checkpoint holds: an edited or
    damaged copy is refused rather than ignored.
    """
    from ..devices import resolve_device
    from ..models.model import SequenceModel
    from ..models.pretrained import load_weights

    file = resolve_checkpoint(path)
    state = load_checkpoint(file)
    config = model_config_of(state, file)
    model = SequenceModel(config)
    load_weights(model, state["model"], str(file))
    tokenizer = checkpoint_tokenizer(state, file)
    check_tokenizer_beside(file, tokenizer)
    return model.to(resolve_device(device)).eval(), state["train_config"], tokenizer


def check_tokenizer_beside(file: Path, tokenizer) -> None:
    """The run's ``tokenizer.json`` beside checkpoint ``file``, if any, must be the one the checkpoint
    keeps: an edited or damaged copy is refused rather than ignored."""
    from ..data.tokenizer import TOKENIZER_FILE, Tokenizer

    beside = file.parent / TOKENIZER_FILE
    if tokenizer is not None and beside.is_file() and Tokenizer.load(beside) != tokenizer:
        raise ValueError(
            f"{str(beside)!r} is not the tokenizer {str(file)!r} was trained with (the checkpoint keeps its own copy): "
            f"restore it from {file.parent / 'model' / TOKENIZER_FILE} or remove it"
        )


def model_config_of(state: dict, path):
    """The checkpoint's ModelConfig; ValueError naming ``path`` for a config this tokenmix cannot build."""
    from ..models.config import ModelConfig

    try:
        return ModelConfig.from_dict(state["model_config"])
    except ValueError as error:
        raise ValueError(f"checkpoint {str(path)!r}: its model config is invalid: {error}") from None
