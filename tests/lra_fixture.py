"""Long Range Arena files in the release layouts, with random content: the tests' fixtures, and, at the
release's sizes, the files on which the CPU-scale presets' time and memory are measured (docs/results/lra.md).

Random texts, pairs and pixels carry no signal: a model trained on them scores the majority class.

    python tests/lra_fixture.py DIR            # release-sized: IMDB, AAN, CIFAR-10, Pathfinder-32 and Path-X
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
from PIL import Image

LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)  # words of about five letters
RELEASE = {  # the release's counts (Pathfinder: the metadata files the CPU presets read, of 200)
    "imdb_per_class": 12_500,
    "aan": {"train": 147_086, "eval": 18_090, "test": 17_437},
    "cifar_per_batch": 10_000,
    "pathfinder32_files": 20,
    "pathx_files": 5,
    "images_per_file": 1000,
}


def _texts(rng, count: int, mean_bytes: int) -> list[bytes]:
    """Random lowercase words, lengths log-normal around ``mean_bytes``."""
    lengths = np.maximum(16, rng.lognormal(np.log(mean_bytes), 0.6, count).astype(int))
    letters = LETTERS[rng.integers(0, len(LETTERS), int(lengths.sum()))].tobytes()
    ends = np.cumsum(lengths)
    return [letters[end - length : end] for end, length in zip(ends, lengths, strict=True)]


def write_imdb(root, per_class: int, seed: int = 0, mean_bytes: int = 1300) -> Path:
    """``aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt``."""
    rng = np.random.default_rng(seed)
    for split in ("train", "test"):
        for label, ratings in (("pos", (7, 11)), ("neg", (1, 5))):
            folder = Path(root) / "aclImdb" / split / label
            folder.mkdir(parents=True, exist_ok=True)
            for index, text in enumerate(_texts(rng, per_class, mean_bytes)):
                (folder / f"{index}_{rng.integers(*ratings)}.txt").write_bytes(text)
    return Path(root)


def write_aan(root, counts: dict[str, int], seed: int = 0, mean_bytes: int = 4000) -> Path:
    """``tsv_data/new_aan_pairs.{train,eval,test}.tsv``: label, two ids, two documents per line."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "tsv_data"
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in counts.items():
        with open(folder / f"new_aan_pairs.{split}.tsv", "wb") as file:
            for start in range(0, count, 10_000):
                rows = min(10_000, count - start)
                documents = _texts(rng, 2 * rows, mean_bytes)
                labels = rng.integers(0, 2, rows)
                file.writelines(
                    b"%d\tP%d-1\tP%d-2\t%s\t%s\n" % (labels[i], start + i, start + i, documents[2 * i], documents[2 * i + 1])
                    for i in range(rows)
                )
    return Path(root)


def write_cifar(root, per_batch: int, seed: int = 0) -> Path:
    """``cifar-10-batches-py/data_batch_1..5, test_batch``: pickled dicts of R, G, B planes and labels."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"):
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8), b"labels": rng.integers(0, 10, per_batch).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    return Path(root)


def write_pathfinder(root, resolution: int, files: int, per_file: int, seed: int = 0, folder: str = "curv_contour_length_14") -> Path:
    """``pathfinder{res}/{folder}/metadata/<k>.npy`` (text) and ``imgs/<k>/sample_<i>.png``."""
    rng = np.random.default_rng(seed)
    base = Path(root) / f"pathfinder{resolution}" / folder
    (base / "metadata").mkdir(parents=True, exist_ok=True)
    for k in range(files):
        (base / "imgs" / str(k)).mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(per_file):
            Image.fromarray(rng.integers(0, 256, (resolution, resolution), dtype=np.uint8)).save(base / "imgs" / str(k) / f"sample_{i}.png")
            lines.append(f"imgs/{k} sample_{i}.png {i} {int(rng.integers(0, 2))} 1.0 6 2 2 0.5 1 1\n")
        (base / "metadata" / f"{k}.npy").write_text("".join(lines))
    return Path(root)


def write_release(root) -> Path:
    """Every file task of the Long Range Arena at the release's size (see ``RELEASE``)."""
    write_imdb(root, RELEASE["imdb_per_class"])
    write_aan(root, RELEASE["aan"])
    write_cifar(root, RELEASE["cifar_per_batch"])
    write_pathfinder(root, 32, RELEASE["pathfinder32_files"], RELEASE["images_per_file"])
    write_pathfinder(root, 128, RELEASE["pathx_files"], RELEASE["images_per_file"])
    return Path(root)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/lra_fixture.py DIR")
    print(write_release(sys.argv[1]))
