"""What only a resume reads of a checkpoint (``runs/checkpoint.py`` holds the format): the RNG states, the
optimizer and schedule, the XL streams, and the run's settings as a TrainConfig, each checked before it is set."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch

from ..models.model import ModelState
from ..runs.checkpoint import check_keys, first_line
from ..runs.migrations import signature_with_segment_length
from ..state import StreamState
from .config import TrainConfig

RESUME_KEYS = {"optimizer": dict, "scheduler": dict, "rng": dict}  # what a resume reads besides the model


def check_resumable(state: dict, path) -> None:
    """ValueError naming ``path`` unless the checkpoint holds what a resume reads besides the model."""
    check_keys(state, RESUME_KEYS, path)
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
        raise ValueError(f"checkpoint {str(path)!r}: its RNG state is malformed ({first_line(error)})") from None


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
        raise ValueError(f"{where}: its optimizer or schedule state does not fit this run: {first_line(error)}") from None
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
        raise ValueError(f"{where} does not fit the model: {first_line(error)}") from None
    finally:
        model.train(training)
    return state


def _state_difference(state, fresh, where: str) -> str | None:
    """How a streaming state differs in layout from a ``fresh`` one of the model: the same classes and
    list lengths, tensors of the same dtype and rank whose sizes agree but along positions (dimension 1)."""
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


def train_config_of(state: dict, path):
    """The checkpoint's TrainConfig; ValueError naming ``path`` for settings this tokenmix refuses."""
    try:
        return TrainConfig.from_dict(state["train_config"])
    except ValueError as error:
        raise ValueError(f"checkpoint {str(path)!r}: its train config is invalid: {error}") from None
