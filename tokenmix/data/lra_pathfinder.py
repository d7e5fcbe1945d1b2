"""LRA Pathfinder and Path-X: are the two dots joined by one dashed path? (Linsley et al. 2018; Long Range Arena,
Tay et al. 2020, arXiv 2011.04006).

Files: the release's ``pathfinder{32,64,128,256}/curv_{baseline,contour_length_9,contour_length_14}/``
under DIR (DIR may also be the ``pathfinder{res}`` folder). In each, ``metadata/<k>.npy`` are, despite
the name, text files: one line per image, ``imgs/<k> sample_<i>.png ...`` with the label (0 or 1)
as the 4th whitespace-separated field; the images are grayscale PNGs ``imgs/<k>/sample_<i>.png``.

Options: ``resolution`` 32 (default), 64, 128 (Path-X) or 256; ``difficulty`` easy, intermediate
or hard (LRA's names for curv_baseline, curv_contour_length_9 and curv_contour_length_14; the
folder names are accepted too), default hard, the one LRA and S4 report; ``limit=N`` reads only
the first N metadata files (by number) for quick runs. Tokens: one per pixel, row-major,
vocabulary 256, grid (res, res), 2 classes. Splits: 80 / 10 / 10 % at random by the run's seed
(S4's procedure: a seeded permutation, val and test int(0.1 n) each). Empty or undecodable images
are skipped with a warning that counts them (the release has one, pathfinder32/curv_baseline/
imgs/0/sample_172.png); a listed image that is absent is an error (an incomplete download).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..io.progress import progress_bar
from ..validation import check_int
from .corpus import BYTE_VOCAB
from .examples import ClassificationData, Examples
from .release_files import Layout, seeded_parts

RESOLUTIONS = (32, 64, 128, 256)
DIFFICULTIES = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}
HELD_OUT = (0.1, 0.1)  # val, test


def _folder(difficulty: str) -> str:
    folder = DIFFICULTIES.get(difficulty, difficulty)
    if folder not in DIFFICULTIES.values():
        raise ValueError(f"lra-pathfinder difficulty must be one of {[*DIFFICULTIES, *DIFFICULTIES.values()]}, got {difficulty!r}")
    return folder


def _listing(layout: Layout, root, limit: int | None) -> list[tuple[str, int]]:
    """(image path relative to root, label) of every metadata line, files in numeric order."""
    files = sorted(
        (path for path in layout.require(root, "metadata").glob("*.npy") if path.stem.isdigit()), key=lambda path: int(path.stem)
    )
    if not files:
        raise ValueError(f"lra-pathfinder: {root / 'metadata'} holds no <k>.npy files; expected {layout.expected}")
    entries = []
    for path in files[:limit]:
        try:
            lines = layout.read(path).decode("utf-8").splitlines()
        except UnicodeDecodeError as error:
            raise ValueError(f"lra-pathfinder: {path} is not a metadata text file (invalid UTF-8 at byte {error.start})") from None
        if not any(line.strip() for line in lines):
            raise ValueError(f"lra-pathfinder: {path} lists no images; expected lines 'imgs/<k> sample_<i>.png <n> <label 0 or 1> ...'")
        for number, line in enumerate(lines, start=1):
            fields = line.split()
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise ValueError(
                    f"lra-pathfinder: {path} line {number}: expected 'imgs/<k> sample_<i>.png <n> <label 0 or 1> ...', got {line[:60]!r}"
                )
            entries.append((f"{fields[0]}/{fields[1]}", int(fields[3])))
    return entries


def _pixels(data: bytes) -> np.ndarray | None:
    """The image's gray values, (height, width); None when empty or undecodable."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("L"))
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None


def load_lra_pathfinder(
    directory, *, resolution: int = 32, difficulty: str = "hard", limit: int | None = None, seed: int = 0
) -> ClassificationData:
    """Pathfinder (Path-X at resolution 128) from ``directory`` (see the module docstring)."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"lra-pathfinder resolution must be one of {list(RESOLUTIONS)}, got {resolution!r}")
    if limit is not None:
        check_int(limit, "lra-pathfinder limit")
    folder = _folder(difficulty)
    expected = f"the release's pathfinder{resolution}/{folder}/ with metadata/<k>.npy and imgs/<k>/sample_<i>.png"
    layout = Layout("lra-pathfinder", expected, (f"pathfinder{resolution}/{folder}", folder))
    root = layout.root(directory, "metadata")
    entries = _listing(layout, root, limit)
    pixels, labels, skipped = np.empty((len(entries), resolution * resolution), dtype=np.uint8), [], []
    for name, label in progress_bar(entries, desc=f"pathfinder{resolution}", unit="image"):
        image = _pixels(layout.read(layout.require(root, name)))
        if image is None:
            skipped.append(name)
            continue
        if image.shape != (resolution, resolution):
            raise ValueError(
                f"lra-pathfinder: {root / name} is {image.shape[1]} x {image.shape[0]} pixels, not {resolution} x {resolution}"
            )
        pixels[len(labels)] = image.reshape(-1)
        labels.append(label)
    if skipped:
        warnings.warn(
            f"lra-pathfinder: skipped {len(skipped)} empty or undecodable images of {len(entries)} (first: {root / skipped[0]})",
            stacklevel=2,
        )
    if not labels:
        raise ValueError(f"lra-pathfinder: none of the {len(entries)} images under {root} could be decoded")
    pixels, labels = pixels[: len(labels)], torch.tensor(labels)
    train, val, test = (
        Examples.from_array(pixels[part.numpy()], labels[part]) for part in seeded_parts(len(labels), HELD_OUT, seed, "lra-pathfinder")
    )
    source = f"lra-pathfinder:{directory}:resolution={resolution}:difficulty={difficulty}" + (f":limit={limit}" if limit else "")
    return ClassificationData(source, BYTE_VOCAB, 2, train, val, test, grid=(resolution, resolution))
