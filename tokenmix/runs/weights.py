"""A model's weights checked against the config that describes them, before a model is built from them.

Weights are safetensors files (data, never code) or a checkpoint's tensors. A config is checked
against the weights' header (names, shapes, dtypes) before any memory is allocated: its sizes first
(``check_sizes``), then the model it describes, built on the meta device (``check_fits``), so a config
asking for more than the weights hold costs nothing. A damaged file is a ValueError naming it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch.nn.modules.module import register_module_parameter_registration_hook

from ..models.config import ModelConfig
from ..models.model import SequenceModel

EMBEDDING = "embedding.weight"  # (vocab_size, dim)
DTYPES = {  # safetensors' names of the dtypes a model's weights may have
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


@contextmanager
def reading_safetensors(path: Path):
    """Within: a file error or a damaged safetensors file is a ValueError naming ``path``."""
    try:
        yield
    except (OSError, SafetensorError) as error:
        raise ValueError(f"{str(path)!r} is not a readable safetensors file: {error}") from None


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; ValueError naming the file when it is missing or damaged."""
    with reading_safetensors(path):
        return load_file(str(path))


def read_header(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file as meta tensors (names, shapes and dtypes from its header; no data
    is read); ValueError naming the file when it is missing or damaged."""
    with reading_safetensors(path), safe_open(str(path), framework="pt") as file:
        entries = {name: file.get_slice(name) for name in file.keys()}
        header = {name: (entry.get_shape(), entry.get_dtype()) for name, entry in entries.items()}
    unknown = sorted({dtype for _, dtype in header.values()} - set(DTYPES))
    if unknown:
        raise ValueError(f"{str(path)!r} holds tensors of dtype {unknown}; a model's weights are one of {list(DTYPES)}")
    return {name: torch.empty(shape, dtype=DTYPES[dtype], device="meta") for name, (shape, dtype) in header.items()}


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str, strict: bool = True) -> None:
    """Copy ``weights`` (read from ``source``) into ``model``, whose keys and shapes they must match
    (every key when ``strict``, else those ``weights`` has); ValueError naming ``source`` and the
    differences otherwise."""
    check_weights(model, weights, source, strict)
    model.load_state_dict(weights, strict=strict)


def check_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str, strict: bool = True) -> None:
    """ValueError naming ``source`` unless ``weights`` fit ``model`` as ``load_weights`` needs (a model
    on the meta device will do: only shapes and dtypes are compared)."""
    own = model.state_dict()
    missing = sorted(key for key in own if key not in weights) if strict else []
    unexpected = sorted(key for key in weights if key not in own)
    wrong = [
        f"{key} {tuple(weights[key].shape)} (model: {tuple(own[key].shape)})"
        for key in sorted(weights)
        if key in own and weights[key].shape != own[key].shape
    ]
    wrong += [
        f"{key} {weights[key].dtype}"
        for key in sorted(weights)
        if key in own and own[key].is_floating_point() and not weights[key].is_floating_point()
    ]
    if missing or unexpected or wrong:
        found = "; ".join(
            f"{label} {items[:4]}{' ...' if len(items) > 4 else ''}"
            for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape or type", wrong))
            if items
        )
        raise ValueError(f"{source}: its weights do not fit the model its config describes ({model.config.name}): {found}")


def check_sizes(data, weights: dict[str, torch.Tensor], source: str) -> None:
    """ValueError naming ``source`` where a saved config ``data`` (a dict not yet resolved: resolving a
    huge depth takes long) asks for a larger vocabulary or width than the weights' embedding has, or more
    blocks than they hold: a bound at no cost before anything is built."""
    if not isinstance(data, dict):
        return  # ``read_model_config`` says what is wrong
    blocks = len({name.split(".")[1] for name in weights if name.startswith("blocks.")})
    bounds = {"depth": (blocks, f"the blocks of depth {blocks}")}
    embedding = weights.get(EMBEDDING)
    if embedding is not None and embedding.dim() == 2:
        shape = f"{EMBEDDING} of shape {tuple(embedding.shape)}"
        bounds |= {"vocab_size": (embedding.shape[0], shape), "dim": (embedding.shape[1], shape)}
    for key, (most, held) in bounds.items():
        asked = data.get(key)
        if type(asked) is int and asked > most:
            raise ValueError(f"{source}: its config asks for {key} {asked}, but its weights hold {held}")


@contextmanager
def parameters_at_most(weights: dict[str, torch.Tensor]):
    """Within: a parameter this thread registers past the number of tensors, or of elements, of ``weights``
    is a ValueError, so building a model that cannot fit them stops at once."""
    tensors, elements = len(weights), sum(tensor.numel() for tensor in weights.values())
    left = [tensors, elements]
    thread = threading.get_ident()

    def spend(module, name, parameter):
        if parameter is not None and threading.get_ident() == thread:
            left[0] -= 1
            left[1] -= parameter.numel()
            if min(left) < 0:
                past = f"{type(module).__name__}.{name} of shape {tuple(parameter.shape)}"
                raise ValueError(f"it has more parameters than the {tensors} tensors ({elements:,} elements) of its weights: {past}")

    handle = register_module_parameter_registration_hook(spend)
    try:
        yield
    finally:
        handle.remove()


def check_fits(config: ModelConfig, weights: dict[str, torch.Tensor], source: str) -> None:
    """ValueError naming ``source`` unless ``weights`` (tensors, or a header's meta tensors) fit the model
    ``config`` describes: built on the meta device (no memory), given up as soon as it outgrows them."""
    try:
        with torch.device("meta"), parameters_at_most(weights):
            model = SequenceModel(config)
    except (ValueError, RuntimeError, TypeError) as error:  # RuntimeError, TypeError: sizes past what a tensor can hold
        reason = str(error).partition("\n")[0]  # torch's own errors go on with its C++ stack
        raise ValueError(f"{source}: the model its config describes cannot be built from its weights: {reason}") from None
    check_weights(model, weights, source)
