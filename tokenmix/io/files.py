"""Atomic file writes: a reader, or a crash, sees the old file or the new one, never half of one.

Failing storage is a ``MachineFault`` naming the file: a full disk (with the bytes needed and free),
a read-only folder, an I/O error. The old file stays as it was and no temporary file is left.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ..errors import MachineFault

TEMPORARY_SUFFIX = ".tmp"
RUST_OS_ERROR = re.compile(r"os error (\d+)")  # how safetensors (Rust's std::io) spells an OSError
REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EIO: "an I/O error (the disk may be failing)",
}


@functools.cache
def default_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0666 less the process umask (0644 usually), read once
    (reading the umask means setting it, which is not thread safe)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def os_error_of(error: BaseException) -> OSError | None:
    """The OSError behind ``error``: itself, one in its cause or context chain (torch.save wraps a failed
    write in a RuntimeError), one of a process's failures DCP gathered, or one a Rust writer names in
    its message; None for any other failure."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen
        for failure in getattr(seen, "failures", {}).values():  # DCP's CheckpointException: {rank: (exception, traceback)}
            found = os_error_of(failure[0] if isinstance(failure, tuple) else failure)
            if found is not None:
                return found
        seen = seen.__cause__ or seen.__context__
    found = RUST_OS_ERROR.search(str(error))
    return OSError(int(found[1]), os.strerror(int(found[1]))) if found else None


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or its nearest existing folder); None if it cannot be read."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def storage_fault(path, error: OSError, needed: int | None = None) -> MachineFault:
    """One line for a write of ``path`` that failed with ``error``; ``needed``: the bytes it was writing."""
    reason = REASONS.get(error.errno, error.strerror or str(error))
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(path)
        sizes = [f"{needed:,} bytes needed" if needed is not None else None, f"{free:,} free" if free is not None else None]
        reason += f" ({', '.join(size for size in sizes if size)})" if any(sizes) else ""
    return MachineFault(f"cannot write {str(path)!r}: {reason}; what was saved before is kept")


def check_free_space(path: Path, needed: int) -> None:
    """MachineFault before writing when the file system of ``path`` lacks ``needed`` bytes."""
    free = free_bytes(path)
    if free is not None and needed > free:
        raise storage_fault(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), needed)


def sync(path: Path) -> None:
    """Flush ``path``'s data to the disk."""
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def atomic_write(path, write: Callable[[Path], None], size: int | None = None, suffix: str = TEMPORARY_SUFFIX) -> Path:
    """Call ``write(temporary)`` for a file beside ``path`` (its name + ``suffix``), flush it to the disk, give
    it the default mode, rename it to ``path``. ``size``: the bytes it will write, if known (a disk without
    them is refused first)."""
    path = Path(path)
    temporary = path.with_name(path.name + suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if size is not None:
            check_free_space(path, size)
        write(temporary)
        sync(temporary)  # on the disk before the rename makes it the file
        os.chmod(temporary, default_file_mode())  # some writers (safetensors) create files 0600
        os.replace(temporary, path)
    except Exception as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        cause = os_error_of(error)
        if cause is None or isinstance(error, MachineFault):
            raise
        raise storage_fault(path, cause, size) from None
    return path


def atomic_folder(directory, write: Callable[[Path], None]) -> Path:
    """Call ``write(temporary)`` for a folder beside ``directory``, then put it in ``directory``'s place
    (replacing what was there); failing storage is a MachineFault and leaves no temporary folder."""
    directory = Path(directory)
    temporary, old = (directory.with_name(directory.name + suffix) for suffix in (TEMPORARY_SUFFIX, ".old" + TEMPORARY_SUFFIX))
    try:
        for stale in (temporary, old):
            shutil.rmtree(stale, ignore_errors=True)
        temporary.mkdir(parents=True)
        write(temporary)
        for path in temporary.rglob("*"):
            if path.is_file():
                sync(path)
        if directory.exists():
            os.replace(directory, old)
        os.replace(temporary, directory)
        shutil.rmtree(old, ignore_errors=True)
    except Exception as error:
        shutil.rmtree(temporary, ignore_errors=True)
        cause = os_error_of(error)
        if cause is None or isinstance(error, MachineFault):
            raise
        raise storage_fault(directory, cause) from None
    return directory


def save_figure(figure, path) -> Path:
    """Write a matplotlib ``figure`` atomically, in the format of ``path``'s suffix (PNG without one)."""
    path = Path(path)
    return atomic_write(path, lambda temporary: figure.savefig(temporary, dpi=110, format=path.suffix[1:] or "png"))


def write_bytes_atomic(path, data: bytes) -> Path:
    return atomic_write(path, lambda temporary: temporary.write_bytes(data), len(data))


def write_text_atomic(path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode())


def write_json_atomic(path, value) -> Path:
    return write_text_atomic(path, json.dumps(value, indent=2) + "\n")


def append_line(path, line: str) -> None:
    """Append ``line`` and a newline to ``path`` (a log); on failing storage the file is cut back to its
    old end (no torn record) and the write is a MachineFault naming it."""
    path = Path(path)
    data = (line + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, default_file_mode())
        try:
            end = os.lseek(descriptor, 0, os.SEEK_END)
            try:
                unwritten = memoryview(data)
                while unwritten:
                    unwritten = unwritten[os.write(descriptor, unwritten) :]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(descriptor, end)
                raise
        finally:
            os.close(descriptor)
    except OSError as error:
        raise storage_fault(path, error, len(data)) from None


def remove_stale_temporaries(directory) -> list[Path]:
    """Delete ``*.tmp`` files a killed write left in ``directory`` (not recursive); returns them."""
    directory = Path(directory)
    stale = sorted(directory.glob("*" + TEMPORARY_SUFFIX)) if directory.is_dir() else []
    for path in stale:
        path.unlink()
    return stale
