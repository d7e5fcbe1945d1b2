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

import dataclasses
import pickle
import random
from pathlib import Path

import numpy as np
import torch

from ..files import atomic_write
from ..models.saving import tensor_bytes
from .sharded_checkpoint import read_weights, shards_of

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_KEY = "checkpoint_format"
CHECKPOINT_FORMAT = 2
# The keys every checkpoint has, with their types (others, such as the optimizer's, are checked where they are read).
REQUIRED_KEYS = {"model_config": dict, "train_config": dict, "model": dict, "step": int}
RESUME_KEYS = {"optimizer": dict, "scheduler": dict, "rng": dict}  # and what a resume reads besides
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
    if state["step"] < 0:
        raise ValueError(f"checkpoint {str(path)!r}: 'step' must be >= 0, got {state['step']}")
    bad = [repr(key) for key, value in state["model"].items() if not (isinstance(key, str) and isinstance(value, torch.Tensor))]
    if bad:
        raise ValueError(f"checkpoint {str(path)!r}: the model's weights must be tensors named by strings; {bad[:3]} are not")
    _check_keys(state["train_config"], TRAIN_CONFIG_KEYS, path, "its train config")
    if state.get("tokenizer") is not None and not isinstance(state["tokenizer"], str):
        kind = type(state["tokenizer"]).__name__
        raise ValueError(f"checkpoint {str(path)!r}: 'tokenizer' must be the tokenizer's JSON text, got {kind}")
    model_config_of(state, path)


def _check_keys(state: dict, kinds: dict, path, where: str = "") -> None:
    for key, kind in kinds.items():
        if key not in state:
            raise ValueError(f"checkpoint {str(path)!r}{where and ': ' + where} lacks {key!r}: not a tokenmix training checkpoint")
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise ValueError(
                f"checkpoint {str(path)!r}{where and ': ' + where}: {key!r} must be a {kind.__name__}, got {type(state[key]).__name__}"
            )


def check_resumable(state: dict, path) -> None:
    """ValueError naming ``path`` unless the checkpoint holds what a resume reads besides the model."""
    _check_keys(state, RESUME_KEYS, path)
    total = state.get("total_steps")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 1):
        raise ValueError(f"checkpoint {str(path)!r}: 'total_steps' must be an int >= 1 or None, got {total!r}")
    seconds = state.get("train_seconds", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise ValueError(f"checkpoint {str(path)!r}: 'train_seconds' must be a number of seconds, got {seconds!r}")
    if not (isinstance(state.get("resumes", []), list) and all(isinstance(entry, dict) for entry in state.get("resumes", []))):
        raise ValueError(f"checkpoint {str(path)!r}: 'resumes' must be a list of records (dicts)")
    files = state.get("data_files")
    if files is not None and not (isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, dict) for k, v in files.items())):
        raise ValueError(f"checkpoint {str(path)!r}: 'data_files' must map file names to their sizes and digests")
    segments = state.get("segment_states")
    if segments is not None and not (isinstance(segments, list) and all(entry is None or isinstance(entry, dict) for entry in segments)):
        raise ValueError(f"checkpoint {str(path)!r}: 'segment_states' must be a list of saved streaming states (dicts) or None")
    check_rng_state(state["rng"], path)


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


def check_rng_state(state: dict, path) -> None:
    """ValueError naming ``path`` unless ``state`` has the layout ``rng_state`` gives (numpy and Python
    take some malformed states without a word, so each part is checked before any is set)."""
    numpy_state, python_state = state.get("numpy"), state.get("python")
    torch_state = state.get("torch")
    problem = None
    if not (isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8 and torch_state.dim() == 1):
        problem = "'torch' must be a 1-D uint8 tensor"
    elif not isinstance(numpy_state, dict) or not _is_int_tensor(numpy_state.get("keys"), (624,)):
        problem = "'numpy' must hold 'keys', 624 integers"
    elif not all(_is_int(numpy_state.get(key)) for key in ("position", "has_gauss")) or not _is_number(numpy_state.get("cached")):
        problem = "'numpy' must hold an integer 'position' and 'has_gauss' and a number 'cached'"
    elif not isinstance(python_state, dict) or not _is_int(python_state.get("version")):
        problem = "'python' must hold an integer 'version'"
    elif not (isinstance(python_state.get("internal"), list) and len(python_state["internal"]) == 625):
        problem = "'python' must hold 'internal', 625 integers"
    elif not all(map(_is_int, python_state["internal"])) or not (
        python_state.get("gauss_next") is None or _is_number(python_state["gauss_next"])
    ):
        problem = "'python' must hold integers in 'internal' and a number or None in 'gauss_next'"
    if problem:
        raise ValueError(f"checkpoint {str(path)!r}: its RNG state is malformed ({problem})")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int_tensor(value, shape: tuple) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex() and tuple(value.shape) == shape


def restore_rng_state(state: dict, path) -> None:
    """Set the RNG states ``rng_state`` returned; ValueError naming ``path`` for a malformed entry."""
    check_rng_state(state, path)
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


def load_optimizer_state(optimizer: torch.optim.Optimizer, scheduler, state: dict, path) -> None:
    """Load a checkpoint's optimizer and schedule states into the run's own (built for the same model
    and settings); ValueError naming ``path`` unless they have the same layout: the same groups with
    values of the same kinds, and each parameter's state tensors either scalars (its step) or of its shape."""
    where = f"checkpoint {str(path)!r}"
    fresh = optimizer.state_dict()["param_groups"]
    difference = _layout_difference(state["optimizer"].get("param_groups"), fresh, "'optimizer' param_groups")
    schedule = state["scheduler"]
    missing = [key for key in ("base_lrs", "last_epoch", "_last_lr") if key not in schedule]
    difference = difference or (f"'scheduler' lacks {missing}" if missing else None)
    difference = difference or _layout_difference(schedule, scheduler.state_dict(), "'scheduler'")
    if difference:
        raise ValueError(f"{where}: its optimizer or schedule state does not fit this run: {difference}")
    try:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as error:
        raise ValueError(f"{where}: its optimizer or schedule state does not fit this run: {_first_line(error)}") from None
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            for key, value in optimizer.state.get(parameter, {}).items():
                if not (isinstance(value, torch.Tensor) and (value.dim() == 0 or value.shape == parameter.shape)):
                    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                    raise ValueError(
                        f"{where}: its optimizer state {key!r} of a parameter of shape {tuple(parameter.shape)} is {shape}: "
                        "it does not fit this run's model"
                    )


def _layout_difference(saved, fresh, where: str) -> str | None:
    """How ``saved`` differs in layout from ``fresh``: the same kinds of values (numbers, strings, flags),
    lists of the same length, dicts with the same values at the keys both have; None if it does not."""
    if isinstance(fresh, (list, tuple)):
        if not (isinstance(saved, (list, tuple)) and len(saved) == len(fresh)):
            return f"{where} must be a list of {len(fresh)}, got {saved!r:.60}"
        found = (_layout_difference(item, model, f"{where}[{k}]") for k, (item, model) in enumerate(zip(saved, fresh, strict=True)))
        return next((difference for difference in found if difference), None)
    if isinstance(fresh, dict):
        if not isinstance(saved, dict):
            return f"{where} must be a dict, got {type(saved).__name__}"
        found = (_layout_difference(saved[key], fresh[key], f"{where}[{key!r}]") for key in fresh if key in saved)
        return next((difference for difference in found if difference), None)
    if isinstance(fresh, bool):
        same = isinstance(saved, bool)
    elif isinstance(fresh, (int, float)):
        same = _is_number(saved)
    elif isinstance(fresh, str):
        same = isinstance(saved, str)
    else:  # None, tensors, callables: not compared
        same = True
    return None if same else f"{where} must be a {type(fresh).__name__}, got {saved!r:.60}"


def segment_state_of(plain: dict | None, model, batch_size: int, path, rank: int = 0):
    """The saved streaming state of a segment-recurrent model (Transformer-XL) rebuilt from its plain
    form, and tried once on ``model`` (in eval mode, without gradients: no weight, RNG or state
    changes); ValueError naming ``path`` unless the model takes it for a batch of ``batch_size``."""
    if plain is None:
        return None
    from ..models.config import signature_with_segment_length
    from ..models.model import ModelState
    from ..state import StreamState

    where = f"checkpoint {str(path)!r}: segment_states[{rank}]"
    state = StreamState.from_plain(plain, where)
    if isinstance(state, ModelState):  # perhaps from before XL models recorded their segment_length
        state.model = signature_with_segment_length(state.model, model.config)
    device, training = next(model.parameters()).device, model.training
    difference = _state_difference(state, model.init_state(batch_size, device=device), "the state")
    if difference:
        raise ValueError(f"{where} does not fit the model: {difference}")
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(batch_size, 1, dtype=torch.long, device=device), state=state.to(device), return_state=True)
    except (ValueError, TypeError, RuntimeError, IndexError, AttributeError) as error:
        raise ValueError(f"{where} does not fit the model: {_first_line(error)}") from None
    finally:
        model.train(training)
    return state


def _state_difference(state, fresh, where: str) -> str | None:
    """How a streaming state differs in layout from a ``fresh`` one of the model: the same classes and
    list lengths, tensors of the same dtype and rank whose sizes agree but along positions (dimension 1)."""
    from ..state import StreamState

    if isinstance(fresh, torch.Tensor):
        if not isinstance(state, torch.Tensor):
            return f"{where} is a {type(state).__name__}, expected a tensor"
        same = state.dtype == fresh.dtype and state.dim() == fresh.dim()
        if same and state.shape[:1] == fresh.shape[:1] and state.shape[2:] == fresh.shape[2:]:
            return None
        expected = ", ".join(["positions" if k == 1 else str(size) for k, size in enumerate(fresh.shape)])
        return f"{where} is {tuple(state.shape)} {state.dtype}, expected ({expected}) {fresh.dtype}"
    if isinstance(fresh, StreamState):
        if type(state) is not type(fresh):
            return f"{where} is a {type(state).__name__}, expected a {type(fresh).__name__}"
        found = (_state_difference(getattr(state, f.name), getattr(fresh, f.name), f"{where}.{f.name}") for f in dataclasses.fields(fresh))
        return next((difference for difference in found if difference), None)
    if isinstance(fresh, (list, tuple)):
        if not isinstance(state, (list, tuple)) or len(state) != len(fresh):
            return f"{where} must be a list of {len(fresh)}"
        found = (_state_difference(item, model, f"{where}[{k}]") for k, (item, model) in enumerate(zip(state, fresh, strict=True)))
        return next((difference for difference in found if difference), None)
    return None


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
    config, weights = checked_model_of(state, file)
    model = SequenceModel(config)
    load_weights(model, weights, str(file))
    tokenizer = checkpoint_tokenizer(state, file)
    check_tokenizer_beside(file, tokenizer)
    return model.to(resolve_device(device)).eval(), state["train_config"], tokenizer


def checked_model_of(state: dict, file: Path):
    """(ModelConfig, weights) of a checkpoint, the config checked against the weights before any model is
    built: a config asking for more than they hold (a depth of 10^7, a width of 10^9) is refused at no cost."""
    from ..models.pretrained import check_fits, check_sizes

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


def train_config_of(state: dict, path):
    """The checkpoint's TrainConfig; ValueError naming ``path`` for settings this tokenmix refuses."""
    from .config import TrainConfig

    try:
        return TrainConfig.from_dict(state["train_config"])
    except ValueError as error:
        raise ValueError(f"checkpoint {str(path)!r}: its train config is invalid: {error}") from None


def model_config_of(state: dict, path):
    """The checkpoint's ModelConfig (an XL model's segment its run's ``seq_len`` where the config
    predates ``segment_length``); ValueError naming ``path`` for a config this tokenmix cannot build."""
    from ..models.config import ModelConfig, with_segment_length

    try:
        config = ModelConfig.from_dict(state["model_config"])
    except ValueError as error:
        raise ValueError(f"checkpoint {str(path)!r}: its model config is invalid: {error}") from None
    return with_segment_length(config, state["model_config"], state["train_config"]["seq_len"])
