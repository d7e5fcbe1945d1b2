"""LRA Image: CIFAR-10 (Krizhevsky 2009) in grayscale, one token per pixel (Long Range Arena, Tay et al. 2020,
arXiv 2011.04006).

Files: either CIFAR-10 release (DIR may hold its folder or be it).
- The python release, ``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``: pickled dicts with
  ``b"data"``, N x 3072 uint8 (the R, G and B planes of a 32 x 32 image, each row by row) and
  ``b"labels"``. A pickle can name code to run; these are read by ``safe_pickle``, which rebuilds
  numpy arrays and plain containers only and refuses anything else.
- The binary release, ``cifar-10-batches-bin/data_batch_1..5.bin`` and ``test_batch.bin``: records
  of 3073 bytes, the label then the same 3072 plane bytes.

Grayscale as ``tf.image.rgb_to_grayscale``, which LRA's pipeline applies: in float32,
``gray = trunc((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5)`` (so pure red, green and blue give
76, 149 and 29). 1024 tokens per image in row-major order, vocabulary 256, 10 classes,
grid (32, 32). Validation: ``val_fraction`` of the 50,000 training images (default 0.1) held out at
random by the run's seed (LRA's code holds out the last 10 % of its training split); test is
``test_batch``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from ..validation import check_number
from .corpus import BYTE_VOCAB
from .examples import ClassificationData, Examples
from .release_files import Layout, seeded_parts
from .safe_pickle import load_arrays_pickle

SIDE = 32
VAL_FRACTION = 0.1
TRAIN_BATCHES = tuple(f"data_batch_{k}" for k in range(1, 6))
LUMA = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
PLANES = 3 * SIDE * SIDE
PYTHON_RELEASE = Layout(
    "lra-image",
    "the CIFAR-10 python release: cifar-10-batches-py/data_batch_1..5, test_batch "
    "(or the binary release: cifar-10-batches-bin/data_batch_1..5.bin, test_batch.bin)",
    ("cifar-10-batches-py", ""),
)
BINARY_RELEASE = Layout(
    "lra-image", "the CIFAR-10 binary release: cifar-10-batches-bin/data_batch_1..5.bin, test_batch.bin", ("cifar-10-batches-bin", "")
)


def grayscale(planes: np.ndarray) -> np.ndarray:
    """(N, 3 * P) uint8 R, G, B planes -> (N, P) uint8 gray values (see the module docstring)."""
    red, green, blue = planes.reshape(len(planes), 3, -1).astype(np.float32).transpose(1, 0, 2) * np.float32(1 / 255)
    gray = (red * LUMA[0] + green * LUMA[1] + blue * LUMA[2]) * np.float32(255.5)
    return gray.astype(np.uint8)


def _read_python_batch(path: Path) -> tuple[np.ndarray, list[int]]:
    try:
        batch = load_arrays_pickle(PYTHON_RELEASE.read(path))
        data, labels = batch[b"data"], list(batch[b"labels"])
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
            raise TypeError(f"its data is {getattr(data, 'dtype', type(data).__name__)}, not uint8")
        wrong = [label for label in labels if isinstance(label, bool) or not isinstance(label, (int, np.integer))]
        if wrong:
            raise TypeError(f"its labels must be integers, not {wrong[0]!r}")
        labels = [int(label) for label in labels]
    except (pickle.UnpicklingError, EOFError, KeyError, IndexError, TypeError, ValueError) as error:
        raise ValueError(f"lra-image: {path} is not a CIFAR-10 python batch ({error}); expected {PYTHON_RELEASE.expected}") from None
    return _checked(path, data, labels)


def _read_binary_batch(path: Path) -> tuple[np.ndarray, list[int]]:
    records = np.frombuffer(BINARY_RELEASE.read(path), dtype=np.uint8)
    if records.size == 0 or records.size % (PLANES + 1):
        raise ValueError(
            f"lra-image: {path} holds {records.size} bytes, not whole records of 1 + {PLANES}; expected {BINARY_RELEASE.expected}"
        )
    records = records.reshape(-1, PLANES + 1)
    return _checked(path, records[:, 1:], records[:, 0].tolist())


def _checked(path: Path, data: np.ndarray, labels: list[int]) -> tuple[np.ndarray, list[int]]:
    if data.shape != (len(labels), PLANES) or not all(0 <= label < 10 for label in labels):
        raise ValueError(
            f"lra-image: {path} holds data of shape {data.shape} and {len(labels)} labels; expected N x {PLANES} uint8 and N labels in 0..9"
        )
    return grayscale(data), labels


def _batches(directory) -> list[tuple[np.ndarray, list[int]]]:
    """The five training batches and the test batch of whichever release ``directory`` holds (the python one first)."""
    base = Path(directory).expanduser() if directory is not None else None
    binary = base is not None and any((base / folder / f"{TRAIN_BATCHES[0]}.bin").is_file() for folder in BINARY_RELEASE.folders)
    if binary:
        root = BINARY_RELEASE.root(directory, f"{TRAIN_BATCHES[0]}.bin")
        return [_read_binary_batch(BINARY_RELEASE.require(root, f"{name}.bin")) for name in (*TRAIN_BATCHES, "test_batch")]
    root = PYTHON_RELEASE.root(directory, TRAIN_BATCHES[0])
    return [_read_python_batch(PYTHON_RELEASE.require(root, name)) for name in (*TRAIN_BATCHES, "test_batch")]


def load_lra_image(directory, *, val_fraction: float = VAL_FRACTION, seed: int = 0) -> ClassificationData:
    """CIFAR-10 from ``directory`` (see the module docstring)."""
    check_number(val_fraction, "lra-image val_fraction", 0, 1, open_minimum=True, open_maximum=True)
    batches = _batches(directory)
    pixels = np.concatenate([pixels for pixels, _ in batches[:-1]])
    labels = torch.tensor([label for _, labels in batches[:-1] for label in labels])
    train, val = (
        Examples.from_array(pixels[part.numpy()], labels[part]) for part in seeded_parts(len(labels), [val_fraction], seed, "lra-image")
    )
    test = Examples.from_array(*batches[-1])
    source = f"lra-image:{directory}:val_fraction={val_fraction}"
    return ClassificationData(source, BYTE_VOCAB, 10, train, val, test, grid=(SIDE, SIDE))
