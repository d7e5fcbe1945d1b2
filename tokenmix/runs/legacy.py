"""Reading a checkpoint of tokenmix 0.2 and earlier (format 1), for a user who trusts it, and rewriting it as format 2.

Format 1 pickled numpy's RNG state (an ndarray), Python's (tuples) and the XL segment memories
(``ModelState`` or the older ``SegmentState`` objects), so reading it means unpickling, which can
run any code the file names. ``load_checkpoint`` refuses such files; ``tokenmix convert-checkpoint
PATH --trust`` calls ``convert_checkpoint``, the one place in tokenmix that unpickles, and only
for a file its user has said they trust; ``migrations.checkpoint_format_1_to_2`` upgrades what it
read. The original is kept beside the new file.
"""

from __future__ import annotations

import pickle
import shutil
import types
from pathlib import Path

import torch

from .checkpoint import FORMAT_KEY, check_checkpoint, resolve_checkpoint, save_checkpoint
from .migrations import SegmentState, checkpoint_format_1_to_2

LEGACY_SUFFIX = ".format1"  # the original is kept as checkpoint.pt.format1


class _LegacyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == ("tokenmix.models.model", "SegmentState"):  # a class tokenmix no longer has
            return SegmentState
        return super().find_class(module, name)


LEGACY_PICKLE = types.SimpleNamespace(Unpickler=_LegacyUnpickler, load=pickle.load, __name__="pickle")


def convert_checkpoint(path) -> tuple[Path, Path]:
    """Rewrite the format 1 checkpoint at ``path`` (a file or run directory) as format 2, keeping the
    original as ``checkpoint.pt.format1``; returns (new file, kept original).

    This unpickles the file: call it only for a file you trust.
    """
    path = resolve_checkpoint(path)
    backup = path.with_name(path.name + LEGACY_SUFFIX)
    if backup.exists():
        raise ValueError(f"{str(backup)!r} exists already: move it away first (it would be replaced by the original of {str(path)!r})")
    state = read_trusted(path)
    if not isinstance(state, dict) or "model_config" not in state:
        raise ValueError(f"{str(path)!r} is not a tokenmix training checkpoint")
    if FORMAT_KEY in state:
        raise ValueError(f"checkpoint {str(path)!r} is already of format {state[FORMAT_KEY]}: nothing to convert")
    converted = checkpoint_format_1_to_2(state)
    check_checkpoint({**converted, FORMAT_KEY: 2}, path)
    shutil.copy2(path, backup)
    save_checkpoint(path, converted)
    return path, backup


def read_trusted(path: Path):
    """The objects of a format 1 checkpoint, unpickled: the user has said they trust this file (the only
    unpickling of arbitrary objects in tokenmix)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=LEGACY_PICKLE)
    except Exception as error:
        raise ValueError(f"checkpoint {str(path)!r} is unreadable: {error}") from None
