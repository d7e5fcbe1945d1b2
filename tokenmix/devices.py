"""Device names from users (``--device``, ``device=``): 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'."""

from __future__ import annotations

import os

import torch

DEVICE_NAMES = "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"


def check_device_name(name: str) -> str:
    """``name`` if it spells a device tokenmix accepts (whether it is present is ``resolve_device``'s question)."""
    kind, colon, index = name.partition(":")
    if name == "auto" or (kind in ("cpu", "cuda", "mps") and (not colon or (kind == "cuda" and index.isdigit()))):
        return name
    raise ValueError(f"device must be {DEVICE_NAMES}, got {name!r}")


def resolve_device(name) -> torch.device:
    """A usable torch.device; ValueError naming the accepted values when it is unknown or absent here.

    ``auto``: CUDA when every process on this node gets its own GPU (torchrun's LOCAL_WORLD_SIZE), else CPU.
    """
    if isinstance(name, str) and name == "auto":
        processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return torch.device("cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= processes else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {name!r}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device {str(device)!r} is not available: this torch build sees no CUDA GPU; use device 'cpu' (or 'auto')")
        if device.index is not None and device.index >= count:
            raise ValueError(f"device {str(device)!r} is not available: {count} CUDA GPU(s) visible, cuda:0 ... cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' is not available here; use device 'cpu' (or 'auto')")
    elif device.type not in ("cpu", "cuda", "mps", "meta"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {name!r}")
    return device
