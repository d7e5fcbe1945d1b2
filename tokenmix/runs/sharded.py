"""Sharded checkpoints (``--fsdp``): every process writes its shard of the weights and the optimizer
state, and any number of processes (one included) reads them back.

The tensors go through ``torch.distributed.checkpoint`` into safetensors files, one per process,
each file's header naming where its shards lie in the whole tensors (DCP's Hugging Face storage):
reading them runs no code, unlike DCP's default pickled metadata. The rest of the checkpoint (step,
schedule, RNG, configs, the optimizer's per-parameter settings) is ``checkpoint.pt`` as for one
process, with ``"shards"`` naming the folder, ``shards/step-N``, and an empty ``"model"``.

A save writes the new folder completely before ``checkpoint.pt`` names it and only then removes the
older one, so a process killed mid-save leaves the previous checkpoint whole (the unfinished folder is
removed by the next save or resume). Reading reshards: a checkpoint written by 4 processes resumes on
2 (FSDP or DDP) or 1, the weights and optimizer state of each process taken from whichever files hold them.

``torch.distributed.checkpoint`` takes about a second to import (it brings DTensor and sympy), so the functions
that write or read shards import it themselves: a command that never touches shards does not wait for it.
"""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import torch

from ..io.files import os_error_of, storage_fault

SHARDS_KEY = "shards"
SHARDS_DIRECTORY = "shards"
MODEL, OPTIMIZER = "model.", "optimizer."  # the prefixes of the two state dicts' tensors in the files
FOLDER_NAME = re.compile(r"shards/step-\d+")


def shards_folder(step: int) -> str:
    """The folder, relative to the run, of the step's sharded tensors."""
    return f"{SHARDS_DIRECTORY}/step-{step:08d}"


def flat_optimizer_state():
    """DCP's state-dict options keying optimizer entries by parameter name, as the weights are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _tensors_and_settings(model, optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The model's and the optimizer's state by parameter name: (their tensors, prefixed; the optimizer's other entries)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    tensors = {MODEL + key: value for key, value in get_model_state_dict(model).items()}
    settings = {}
    for key, value in get_optimizer_state_dict(model, optimizer, options=flat_optimizer_state()).items():
        if isinstance(value, torch.Tensor):
            tensors[OPTIMIZER + key] = value
        else:
            settings[key] = value
    return tensors, settings


def save_shards(out: Path, step: int, model, optimizer, is_main: bool, barrier) -> tuple[str, dict]:
    """Write this process's shards of ``model`` and ``optimizer`` to ``out / shards_folder(step)`` (every
    process calls it); returns (the folder, the optimizer's settings for ``checkpoint.pt``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    folder = shards_folder(step)
    if is_main and (out / folder).exists():  # left by a save killed at this step before a resume
        shutil.rmtree(out / folder)
    barrier()
    tensors, settings = _tensors_and_settings(model, optimizer)
    try:
        dcp.save(tensors, storage_writer=dcp.HuggingFaceStorageWriter(str(out / folder), save_distributed=True))
    except (Exception, CheckpointException) as error:  # DCP's exception, raised on every process, is a BaseException
        cause = os_error_of(error)
        if cause is None:
            raise
        if is_main:
            shutil.rmtree(out / folder, ignore_errors=True)
        raise storage_fault(out / folder, cause) from None
    return folder, settings


def remove_unused_shards(out: Path, kept: str | None) -> list[Path]:
    """Delete the shard folders in ``out`` but ``kept`` (the checkpoint's; None: ``shards`` goes too); returns them."""
    parent = Path(out) / SHARDS_DIRECTORY
    unused = sorted(path for path in parent.iterdir() if path != Path(out) / (kept or "")) if parent.is_dir() else []
    for path in unused:
        shutil.rmtree(path)
    if kept is None and parent.is_dir():
        parent.rmdir()
    return unused


def shards_of(state: dict, file: Path) -> Path | None:
    """The shard folder a checkpoint names (None for a checkpoint of whole tensors); ValueError naming
    ``file`` for a name that is not a folder of the run's ``shards``, or a folder that is missing."""
    folder = state.get(SHARDS_KEY)
    if folder is None:
        return None
    if not (isinstance(folder, str) and FOLDER_NAME.fullmatch(folder)):
        raise ValueError(f"checkpoint {str(file)!r}: {SHARDS_KEY!r} must name a folder shards/step-N of its run, got {folder!r:.80}")
    path = file.parent / folder
    if not path.is_dir():
        raise ValueError(f"checkpoint {str(file)!r} keeps its weights in {str(path)!r}, which is missing: copy the whole run directory")
    return path


def _read(folder: Path, tensors: dict[str, torch.Tensor], single_process: bool) -> None:
    """Fill ``tensors`` (whole or sharded) from the files in ``folder``; ValueError naming it when they cannot be."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        try:
            dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(str(folder)), no_dist=single_process)
        except Exception as error:  # DCP gathers every process's failure into one CheckpointException
            first = (str(error).strip().splitlines() or [type(error).__name__])[-1]
            raise ValueError(f"sharded checkpoint {str(folder)!r} does not fit this run's model and optimizer: {first[:300]}") from None


def load_shards(folder: Path, settings: dict, model, optimizer) -> None:
    """Load the weights and optimizer state of ``folder`` into ``model`` and ``optimizer`` (sharded by FSDP
    or whole, on any number of processes: every process calls it); ``settings``: the optimizer's entries kept in ``checkpoint.pt``."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    tensors, _ = _tensors_and_settings(model, optimizer)
    _read(folder, tensors, single_process=not torch.distributed.is_initialized())
    set_model_state_dict(model, {key[len(MODEL) :]: value for key, value in tensors.items() if key.startswith(MODEL)})
    optimizer_state = {key[len(OPTIMIZER) :]: value for key, value in tensors.items() if key.startswith(OPTIMIZER)}
    try:
        set_optimizer_state_dict(model, optimizer, {**optimizer_state, **settings}, options=flat_optimizer_state())
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"sharded checkpoint {str(folder)!r}: its optimizer settings do not fit this run: {error}") from None


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The whole weights in ``folder``, read in this process alone (for ``eval``, ``generate``, ``export-hf``)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    metadata = HuggingFaceStorageReader(str(folder)).read_metadata().state_dict_metadata
    tensors = {key: torch.empty(entry.size, dtype=entry.properties.dtype) for key, entry in metadata.items() if key.startswith(MODEL)}
    if not tensors:
        raise ValueError(f"sharded checkpoint {str(folder)!r} holds no weights")
    _read(folder, tensors, single_process=True)
    return {key[len(MODEL) :]: value for key, value in tensors.items()}
