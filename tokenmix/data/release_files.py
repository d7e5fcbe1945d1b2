"""Where a dataset release (the Long Range Arena's, WikiText's) lies under a user's directory, and
seeded splits for tasks without fixed ones.

Every loader names its release ``Layout``; a missing directory or file is a ValueError that names
the path it looked for and the layout it expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .provenance import note_read


@dataclass(frozen=True)
class Layout:
    """The files of task ``task`` (its ``--data`` name), described by ``expected``; they lie in
    ``DIR/folder`` for the first of ``folders`` that holds them (``""`` is DIR itself)."""

    task: str
    expected: str
    folders: tuple[str, ...]

    def root(self, directory, marker: str) -> Path:
        """The folder under ``directory`` holding ``marker`` (a file or folder of the release)."""
        if directory is None:
            raise ValueError(f"{self.task} needs the directory of its files: {self.task}:DIR; expected {self.expected}")
        base = Path(directory).expanduser()
        if not base.is_dir():
            raise ValueError(f"{self.task}: directory {base} does not exist; expected {self.expected}")
        roots = [base / folder for folder in self.folders]
        root = next((root for root in roots if (root / marker).exists()), None) or next((root for root in roots if root.is_dir()), roots[0])
        self.require(root, marker)
        return root

    def require(self, root: Path, name: str) -> Path:
        """``root / name``, which must exist."""
        path = root / name
        if not path.exists():
            raise ValueError(f"{self.task}: {path} is missing; expected {self.expected}")
        return path

    def open(self, path: Path, mode: str = "rb", **options):
        """``open(path, mode, **options)``; ValueError naming the file when it cannot be opened."""
        note_read(path)
        try:
            return open(path, mode, **options)
        except OSError as error:
            raise ValueError(f"{self.task}: {path} is unreadable: {error.strerror}") from None

    def read(self, path: Path) -> bytes:
        with self.open(path) as file:
            return file.read()


def seeded_parts(count: int, held_out: Sequence[float], seed: int, task: str) -> list[torch.Tensor]:
    """Indices of ``count`` examples in random order (``torch.randperm`` seeded by ``seed``), cut into the
    rest followed by one part of ``int(f * count)`` per fraction ``f`` of ``held_out``; none may be empty."""
    sizes = [int(fraction * count) for fraction in held_out]
    if min(sizes) < 1 or sum(sizes) >= count:
        raise ValueError(
            f"{task}: {count} examples are too few to hold out fractions {list(held_out)} (at least one each, and one to train)"
        )
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return list(torch.split(order, [count - sum(sizes), *sizes]))
