"""Converting a checkpoint of tokenmix 0.2 and earlier (format 1) to format 2, for a user who trusts it.

Format 1 pickled numpy's RNG state (an ndarray), Python's (tuples) and the XL segment memories
(``ModelState`` or the older ``SegmentState`` objects), so reading it means unpickling, which can
run any code the file names. ``load_checkpoint`` refuses such files; ``tokenmix convert-checkpoint
PATH --trust`` calls ``convert_checkpoint``, the one place in tokenmix that unpickles, and only
for a file its user has said they trust. The original is kept beside the new file.
"""

from __future__ import annotations

import pickle
import shutil
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checkpoint import FORMAT_KEY, check_checkpoint, resolve_checkpoint, save_checkpoint

LEGACY_SUFFIX = ".format1"  # the original is kept as checkpoint.pt.format1


@dataclass
class _SegmentState:
    """What checkpoints written before streaming states held for XL models: each block's memory."""

    memory: list
    position: int = 0


class _LegacyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == ("tokenmix.models.model", "SegmentState"):  # a class tokenmix no longer has
            return _SegmentState
        return super().find_class(module, name)


_LEGACY_PICKLE = types.SimpleNamespace(Unpickler=_LegacyUnpickler, load=pickle.load, __name__="pickle")


def _plain_rng(rng: dict) -> dict:
    """Format 1's RNG states (numpy's tuple with an ndarray, Python's tuples) as format 2 stores them."""
    _, keys, position, has_gauss, cached = rng["numpy"]
    version, internal, gauss_next = rng["python"]
    return {
        "torch": rng["torch"],
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "position": position,
            "has_gauss": has_gauss,
            "cached": cached,
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }


def _plain_segment_state(state, model_config: dict, segment_length: int):
    """A saved XL stream as a plain dict; ``SegmentState`` memories become the state of the blocks at a segment boundary."""
    if state is None:
        return None
    if isinstance(state, _SegmentState):
        from ..models.config import ModelConfig, with_segment_length
        from ..models.model import SequenceModel

        model = SequenceModel(with_segment_length(ModelConfig.from_dict(model_config), model_config, segment_length))
        first = state.memory[0]
        modern = model.init_state(first.shape[0], device=first.device, dtype=first.dtype)
        for block, memory in zip(modern.blocks, state.memory, strict=True):
            block.memory, block.position = memory, state.position
        modern.position = state.position
        state = modern
    return state.to_plain()


def _tokenizer_json(state: dict):
    """Format 1 checkpoints written before tokenizers were text runs in bytes."""
    if "tokenizer" in state:
        return state["tokenizer"]
    from ..data.sources import source_kind
    from ..data.tokenizer import byte_tokenizer

    return byte_tokenizer().to_json() if source_kind(state["train_config"]["data"]) == "corpus" else None


def convert_checkpoint(path) -> tuple[Path, Path]:
    """Rewrite the format 1 checkpoint at ``path`` (a file or run directory) as format 2, keeping the
    original as ``checkpoint.pt.format1``; returns (new file, kept original).

    This unpickles the file: call it only for a file you trust.
    """
    path = resolve_checkpoint(path)
    backup = path.with_name(path.name + LEGACY_SUFFIX)
    if backup.exists():
        raise ValueError(f"{str(backup)!r} exists already: move it away first (it would be replaced by the original of {str(path)!r})")
    try:
        # The user has said they trust this file: the only unpickling of arbitrary objects in tokenmix.
        state = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_LEGACY_PICKLE)
    except Exception as error:
        raise ValueError(f"checkpoint {str(path)!r} is unreadable: {error}") from None
    if not isinstance(state, dict) or "model_config" not in state:
        raise ValueError(f"{str(path)!r} is not a tokenmix training checkpoint")
    if FORMAT_KEY in state:
        raise ValueError(f"checkpoint {str(path)!r} is already of format {state[FORMAT_KEY]}: nothing to convert")
    segment_length = state["train_config"]["seq_len"]
    converted = {
        **state,
        "rng": _plain_rng(state["rng"]),
        "segment_states": [_plain_segment_state(item, state["model_config"], segment_length) for item in state.get("segment_states") or []]
        or None,
        "tokenizer": _tokenizer_json(state),
    }
    check_checkpoint({**converted, FORMAT_KEY: 2}, path)
    shutil.copy2(path, backup)
    save_checkpoint(path, converted)
    return path, backup
