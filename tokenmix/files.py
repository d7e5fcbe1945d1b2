"""Atomic file writes: a reader, or a crash, sees the old file or the new one, never half of one."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path

TEMPORARY_SUFFIX = ".tmp"


@functools.cache
def default_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0666 less the process umask (0644 usually), read once
    (reading the umask means setting it, which is not thread safe)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path, write: Callable[[Path], None]) -> Path:
    """Call ``write(temporary)`` for a file beside ``path``, give it the default mode, rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + TEMPORARY_SUFFIX)
    write(temporary)
    os.chmod(temporary, default_file_mode())  # some writers (safetensors) create files 0600
    os.replace(temporary, path)
    return path


def write_text_atomic(path, text: str) -> Path:
    return atomic_write(path, lambda temporary: temporary.write_text(text))


def write_json_atomic(path, value) -> Path:
    return write_text_atomic(path, json.dumps(value, indent=2) + "\n")


def remove_stale_temporaries(directory) -> list[Path]:
    """Delete ``*.tmp`` files a killed write left in ``directory`` (not recursive); returns them."""
    directory = Path(directory)
    stale = sorted(directory.glob("*" + TEMPORARY_SUFFIX)) if directory.is_dir() else []
    for path in stale:
        path.unlink()
    return stale
