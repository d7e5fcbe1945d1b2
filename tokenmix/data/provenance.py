"""The files a data source was read from, with their sizes and SHA-256 digests, so that a resumed
run can tell that its data changed.

Readers call ``note_read(path)`` for each file they read. ``record_reads()`` collects those paths
while a source loads; ``ReadLog.fingerprints()`` then describes them, keyed by their path relative
to the folder they share (so a moved copy of the same files matches): one entry per file, or one
per folder that holds more than ``PER_FILE_LIMIT`` of them (the count, the total size and a digest
over the files' names and digests), as an image release of 10^5 files would otherwise bloat every
checkpoint. ``data_changes`` compares two such descriptions.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

PER_FILE_LIMIT = 64
_CHUNK = 1 << 20
_logs: list[ReadLog] = []


def note_read(path) -> None:
    """Record that ``path`` was read, if a ``record_reads`` block is open."""
    for log in _logs:
        log.paths.add(Path(path))


class ReadLog:
    def __init__(self):
        self.paths: set[Path] = set()

    def fingerprints(self) -> dict[str, dict]:
        """{relative path or "folder/*": {"bytes", "sha256"[, "files"]}} of the files read (see the module docstring)."""
        if not self.paths:
            return {}
        files = sorted(self.paths)
        root = Path(os.path.commonpath([str(path.parent) for path in files]))
        digests = {path.relative_to(root).as_posix(): _digest(path) for path in files}
        folders = defaultdict(list)
        for name in digests:
            folders[name.rpartition("/")[0]].append(name)
        entries = {}
        for folder, names in sorted(folders.items()):
            if len(names) <= PER_FILE_LIMIT:
                entries.update({name: digests[name] for name in names})
                continue
            combined = hashlib.sha256()
            for name in names:
                combined.update(f"{name}\0{digests[name]['sha256']}\n".encode())
            size = sum(digests[name]["bytes"] for name in names)
            entries[f"{folder}/*" if folder else "*"] = {"files": len(names), "bytes": size, "sha256": combined.hexdigest()}
        return entries


def _digest(path: Path) -> dict:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


@contextlib.contextmanager
def record_reads() -> Iterator[ReadLog]:
    """The files noted (``note_read``) while the block runs."""
    log = ReadLog()
    _logs.append(log)
    try:
        yield log
    finally:
        _logs.remove(log)


def data_changes(saved: dict, current: dict) -> list[str]:
    """How the files of ``current`` differ from ``saved`` (two ``fingerprints()``), one line per file."""
    changes = []
    for name in sorted(set(saved) | set(current)):
        before, now = saved.get(name), current.get(name)
        if before == now:
            continue
        if now is None:
            changes.append(f"{name}: read before, not now")
        elif before is None:
            changes.append(f"{name}: read now, not before")
        elif before.get("bytes") != now.get("bytes"):
            changes.append(f"{name}: {before.get('bytes')} bytes, now {now.get('bytes')}")
        else:
            changes.append(f"{name}: same size, different content")
    return changes
