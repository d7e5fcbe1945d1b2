"""Training checkpoints: one file of tensors and plain containers, written atomically, read without running code.

A checkpoint is a dict that ``torch.load(..., weights_only=True)`` reads: tensors, numbers,
strings, lists and dicts. Unpickling a Python object can call any function the file names, so a
checkpoint holds none: RNG states are stored as tensors and numbers, streaming states as plain
dicts (``StreamState.to_plain``), configs as dicts, the tokenizer as its JSON. PyTorch itself has
loaded with ``weights_only=True`` by default since 2.6 for this reason.

Checkpoints of tokenmix 0.2 and earlier (format 1, no ``checkpoint_format`` key) pickled numpy's
RNG state and the XL memories as objects. They are refused with the one command that converts
them, ``tokenmix convert-checkpoint PATH --trust`` (``legacy.py``), which unpickles the
file once, after its user says they trust where it came from.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from ..data.tokenizer import TOKENIZER_FILE, Tokenizer
from ..io.files import atomic_write
from ..models.config import ModelConfig
from ..models.saving import tensor_bytes
from .layout import CHECKPOINT_FILE, MODEL_DIRECTORY
from .migrations import read_model_config, with_segment_length
from .sharded import read_weights, shards_of
from .weights import check_fits, check_sizes

FORMAT_KEY = "checkpoint_format"
CHECKPOINT_FORMAT = 2
# The keys every checkpoint has, with their types (others, such as the optimizer's, are checked where they are read).
REQUIRED_KEYS = {"model_config": dict, "train_config": dict, "model": dict, "step": int}
TRAIN_CONFIG_KEYS = {"data": str, "seq_len": int, "seed": int}  # what eval, generate and export-hf read of the train config


def save_checkpoint(path, state: dict) -> None:
    """Write atomically: a kill during the save leaves the previous checkpoint (and a stale .tmp), failing
    storage a MachineFault naming the file (and the previous checkpoint)."""
    atomic_write(path, lambda temporary: _save(temporary, {**state, FORMAT_KEY: CHECKPOINT_FORMAT}), size=tensor_bytes(state))


def _save(path: Path, state: dict) -> None:
    with open(path, "wb") as file:  # through Python's file: a failed write's OSError reaches the caller (a path would hide it)
        torch.save(state, file)


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
        raise ValueError(f"checkpoint {str(path)!r} is unreadable: {first_line(error)}") from None
    except Exception as error:  # truncated, empty or foreign files: torch raises RuntimeError, EOFError, ...
        raise ValueError(f"checkpoint {str(path)!r} is unreadable: {first_line(error)}") from None
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
    check_keys(state, REQUIRED_KEYS, path)
    if state["step"] < 0:
        raise ValueError(f"checkpoint {str(path)!r}: 'step' must be >= 0, got {state['step']}")
    bad = [repr(key) for key, value in state["model"].items() if not (isinstance(key, str) and isinstance(value, torch.Tensor))]
    if bad:
        raise ValueError(f"checkpoint {str(path)!r}: the model's weights must be tensors named by strings; {bad[:3]} are not")
    check_keys(state["train_config"], TRAIN_CONFIG_KEYS, path, "its train config")
    if state.get("tokenizer") is not None and not isinstance(state["tokenizer"], str):
        kind = type(state["tokenizer"]).__name__
        raise ValueError(f"checkpoint {str(path)!r}: 'tokenizer' must be the tokenizer's JSON text, got {kind}")
    model_config_of(state, path)


def check_keys(state: dict, kinds: dict, path, where: str = "") -> None:
    """ValueError naming ``path`` (and ``where`` in it) unless ``state`` has each key of ``kinds`` with a value of its type."""
    for key, kind in kinds.items():
        if key not in state:
            raise ValueError(f"checkpoint {str(path)!r}{where and ': ' + where} lacks {key!r}: not a tokenmix training checkpoint")
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise ValueError(
                f"checkpoint {str(path)!r}{where and ': ' + where}: {key!r} must be a {kind.__name__}, got {type(state[key]).__name__}"
            )


def first_line(error: Exception) -> str:
    """The first line of an error's message (torch's own go on with its C++ stack), or its type's name."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def checkpoint_tokenizer(state: dict, path="the checkpoint") -> Tokenizer | None:
    """The tokenizer a checkpoint was trained with (its JSON is kept in it); None for data with ids
    of its own (ListOps, LRA, recall)."""
    return None if state.get("tokenizer") is None else Tokenizer.from_json(state["tokenizer"], f"{path} (its tokenizer)")


def checked_model_of(state: dict, file: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(ModelConfig, weights) of a checkpoint, the config checked against the weights before any model is
    built: a config asking for more than they hold (a depth of 10^7, a width of 10^9) is refused at no cost."""
    weights, source = checkpoint_weights(state, file), f"checkpoint {str(file)!r}"
    check_sizes(state["model_config"], weights, source)
    config = model_config_of(state, file)
    check_fits(config, weights, source)
    return config, weights


def checkpoint_weights(state: dict, file: Path) -> dict[str, torch.Tensor]:
    """The model's weights of a checkpoint read from ``file``: kept in it, or read whole from the shard
    folder it names (a run trained with ``--fsdp``)."""
    shards = shards_of(state, file)
    return state["model"] if shards is None else read_weights(shards)


def check_tokenizer_beside(file: Path, tokenizer: Tokenizer | None) -> None:
    """The run's ``tokenizer.json`` beside checkpoint ``file``, if any, must be the one the checkpoint
    keeps: an edited or damaged copy is refused rather than ignored."""
    beside = file.parent / TOKENIZER_FILE
    if tokenizer is not None and beside.is_file() and Tokenizer.load(beside) != tokenizer:
        raise ValueError(
            f"{str(beside)!r} is not the tokenizer {str(file)!r} was trained with (the checkpoint keeps its own copy): "
            f"restore it from {file.parent / MODEL_DIRECTORY / TOKENIZER_FILE} or remove it"
        )


def model_config_of(state: dict, path) -> ModelConfig:
    """The checkpoint's ModelConfig (an XL model's segment its run's ``seq_len`` where the config
    predates ``segment_length``); ValueError naming ``path`` for a config this tokenmix cannot build."""
    try:
        config = read_model_config(state["model_config"])
    except ValueError as error:
        raise ValueError(f"checkpoint {str(path)!r}: its model config is invalid: {error}") from None
    return with_segment_length(config, state["model_config"], state["train_config"]["seq_len"])
