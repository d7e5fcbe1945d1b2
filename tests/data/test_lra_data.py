"""The Long Range Arena loaders on small files written in the releases' exact layouts."""

import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from tokenmix.data import load_data, load_lra_image, load_lra_pathfinder, load_lra_retrieval, load_lra_text
from tokenmix.data.lra_image import grayscale


def _all_tokens(examples) -> list[bytes]:
    return [bytes(examples.sequence(i, d).tolist()) for i in range(len(examples)) for d in range(examples.documents)]


# --- Text: aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt


@pytest.fixture
def imdb(tmp_path):
    reviews = {}
    for split, count in (("train", 10), ("test", 4)):
        for label, name in enumerate(("neg", "pos")):
            folder = tmp_path / "aclImdb" / split / name
            folder.mkdir(parents=True)
            for k in range(count):
                text = f"{split} {name} review {k}: caf\u00e9 <br /><br />{'x' * (30 * k)}".encode()
                (folder / f"{k * 7}_{3 if label == 0 else 8}.txt").write_bytes(text)
                reviews[text] = label
    (tmp_path / "aclImdb" / "train" / "unsup").mkdir()  # in the release; not a class
    (tmp_path / "aclImdb" / "train" / "unsup" / "0_0.txt").write_bytes(b"unlabelled")
    return tmp_path, reviews


def test_text_reads_bytes_truncates_and_holds_out_validation(imdb):
    directory, reviews = imdb
    data = load_data(f"lra-text:{directory}:max_length=60:val_fraction=0.25", 0, seed=3)
    assert (data.vocab_size, data.num_classes, data.grid, data.documents) == (256, 2, None, 1)
    assert (len(data.train), len(data.val), len(data.test)) == (15, 5, 8)
    truncated = {text[:60]: label for text, label in reviews.items()}
    for split in (data.train, data.val, data.test):
        for tokens, label in zip(_all_tokens(split), split.labels.tolist(), strict=True):
            assert truncated[tokens] == label
    assert int(data.train.lengths().max()) == 60 and "café".encode() in _all_tokens(data.test)[0]
    held = set(_all_tokens(data.val))
    assert not held & set(_all_tokens(data.train)) and all(b"train " in t for t in held)
    again = load_lra_text(directory / "aclImdb", max_length=60, val_fraction=0.25, seed=3)  # DIR may be aclImdb itself
    assert set(_all_tokens(again.val)) == held
    assert set(_all_tokens(load_lra_text(directory, max_length=60, val_fraction=0.25, seed=4).val)) != held
    full = load_lra_text(directory)
    assert int(full.test.lengths().max()) == max(len(text) for text in reviews if text.startswith(b"test"))  # 4000 cuts nothing


def test_text_names_what_is_missing(imdb, tmp_path):
    directory, _ = imdb
    (directory / "aclImdb" / "test" / "neg" / "0_3.txt").rename(directory / "aclImdb" / "test" / "neg" / "notes.txt")
    with pytest.raises(ValueError, match=r"files not named <id>_<rating>.txt: \['notes.txt'\]"):
        load_lra_text(directory)
    for path in sorted((directory / "aclImdb" / "test" / "neg").iterdir()):
        path.unlink()
    (directory / "aclImdb" / "test" / "neg").rmdir()
    with pytest.raises(ValueError, match=r"aclImdb/test/neg is missing; expected the aclImdb release"):
        load_lra_text(directory)
    with pytest.raises(ValueError, match=r"aclImdb/train/train/pos is missing"):  # neither DIR/aclImdb nor DIR holds train/pos
        load_lra_text(tmp_path / "aclImdb" / "train")
    with pytest.raises(ValueError, match="needs the directory of its files: lra-text:DIR"):
        load_data("lra-text", 0)
    with pytest.raises(ValueError, match=r"unknown options \['length'\]; accepted: \['max_length', 'val_fraction'\]"):
        load_data(f"lra-text:{directory}:length=5", 0)
    for bad in ("val_fraction=1", "val_fraction=0", "max_length=0"):
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            load_data(f"lra-text:{directory}:{bad}", 0)


# --- Retrieval: tsv_data/new_aan_pairs.{train,eval,test}.tsv, no header: label, id1, id2, text1, text2


def test_retrieval_reads_two_documents_per_pair(aan):
    folder, rows = aan
    for directory in (folder, folder.parent):
        data = load_data(f"lra-retrieval:{directory}:max_length=50", 0)
        assert (data.documents, data.num_classes, data.vocab_size) == (2, 2, 256)
        assert (len(data.train), len(data.val), len(data.test)) == (6, 2, 3)
        for split, name in ((data.train, "train"), (data.val, "eval"), (data.test, "test")):
            assert split.labels.tolist() == [label for label, _, _ in rows[name]]
            assert _all_tokens(split) == [text[:50] for _, first, second in rows[name] for text in (first, second)]
    tokens, mask, labels = data.train.batch([0, 5])
    assert tokens.shape[:2] == (2, 2) and mask.shape == tokens.shape and labels.tolist() == [1, 1]


def test_retrieval_refuses_broken_files(aan):
    folder, _ = aan
    with open(folder / "new_aan_pairs.eval.tsv", "ab") as file:
        file.write(b"2\ta\tb\tc\td\n")
    with pytest.raises(ValueError, match=r"new_aan_pairs.eval.tsv line 3: expected 5 tab-separated columns"):
        load_lra_retrieval(folder)
    (folder / "new_aan_pairs.test.tsv").unlink()
    with pytest.raises(ValueError, match=r"tsv_data/new_aan_pairs.test.tsv is missing; expected the release's tsv_data"):
        load_lra_retrieval(folder.parent)


# --- Image: cifar-10-batches-py/data_batch_1..5, test_batch (pickled dicts)


def _cifar_batch(path, images: np.ndarray, labels: list[int]) -> None:
    """As the release: R, G, B planes of 32 x 32, each row by row; a dict with bytes keys."""
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
    batch = {b"batch_label": b"fixture", b"labels": labels, b"data": planes, b"filenames": [b"x.png"] * len(labels)}
    path.write_bytes(pickle.dumps(batch, protocol=2))


@pytest.fixture
def cifar(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    images = {}
    for name in (*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"):
        images[name] = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
        _cifar_batch(folder / name, images[name], [int(v) for v in rng.integers(0, 10, 4)])
    return tmp_path, images


def test_grayscale_is_tensorflow_rgb_to_grayscale():
    pixels = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [0, 0, 0], [100, 100, 100]], dtype=np.uint8)
    planes = pixels.T.reshape(1, -1)  # R plane, G plane, B plane of a 1 x 6 image
    assert grayscale(planes).tolist() == [[76, 149, 29, 255, 0, 100]]


def test_image_pixels_are_gray_row_major_with_a_seeded_validation_split(cifar):
    directory, images = cifar
    data = load_data(f"lra-image:{directory}:val_fraction=0.25", 0, seed=1)
    assert (data.vocab_size, data.num_classes, data.grid) == (256, 10, (32, 32))
    assert (len(data.train), len(data.val), len(data.test)) == (15, 5, 4)
    test_image = images["test_batch"][2].astype(np.float64)
    expected = (test_image @ [0.2989, 0.587, 0.114]) / 255 * 255.5  # row-major 32 x 32
    assert np.abs(data.test.sequence(2).numpy().reshape(32, 32) - expected).max() < 1.0001
    assert data.test.tokens.dtype == torch.uint8 and data.test.lengths().unique().tolist() == [1024]
    train_rows = {row.tobytes() for name in images if name != "test_batch" for row in grayscale(_planes(images[name]))}
    split_rows = {t for split in (data.train, data.val) for t in _all_tokens(split)}
    assert split_rows == train_rows and not set(_all_tokens(data.val)) & set(_all_tokens(data.train))
    assert set(_all_tokens(load_lra_image(directory / "cifar-10-batches-py", val_fraction=0.25, seed=1).val)) == set(_all_tokens(data.val))


def _planes(images: np.ndarray) -> np.ndarray:
    return images.transpose(0, 3, 1, 2).reshape(len(images), 3072)


def test_image_names_the_missing_batch_and_refuses_other_pickles(cifar):
    directory, _ = cifar
    (directory / "cifar-10-batches-py" / "data_batch_3").unlink()
    message = r"cifar-10-batches-py/data_batch_3 is missing; expected the CIFAR-10 python release: cifar-10-batches-py/data_batch_1..5"
    with pytest.raises(ValueError, match=message):
        load_data(f"lra-image:{directory}", 0)
    (directory / "cifar-10-batches-py" / "data_batch_3").write_bytes(
        pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]})
    )
    with pytest.raises(ValueError, match="data_batch_3 holds data of shape"):
        load_lra_image(directory)
    (directory / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="data_batch_3 is not a CIFAR-10 python batch"):
        load_lra_image(directory)
    with pytest.raises(ValueError, match=r"unknown options \['grayscale'\]; accepted: \['val_fraction'\]"):
        load_data(f"lra-image:{directory}:grayscale=1", 0)


# --- Pathfinder: pathfinder{res}/curv_{...}/metadata/<k>.npy (text) and imgs/<k>/sample_<i>.png


def _pathfinder(root, resolution: int, folder: str, files: int, per_file: int, seed: int = 0) -> dict[str, tuple[np.ndarray, int]]:
    """Images and metadata as the release lays them out; returns {relative path: (pixels, label)}."""
    rng, written = np.random.default_rng(seed), {}
    base = root / f"pathfinder{resolution}" / folder
    (base / "metadata").mkdir(parents=True)
    for k in range(files):
        (base / "imgs" / str(k)).mkdir(parents=True)
        lines = []
        for i in range(per_file):
            pixels, label = rng.integers(0, 256, (resolution, resolution), dtype=np.uint8), int(rng.integers(0, 2))
            Image.fromarray(pixels).save(base / "imgs" / str(k) / f"sample_{i}.png")
            lines.append(f"imgs/{k} sample_{i}.png {i} {label} 1.0 6 2 2 0.5 1 1\n")
            written[f"imgs/{k}/sample_{i}.png"] = (pixels, label)
        (base / "metadata" / f"{k}.npy").write_text("".join(lines))
    return written


def test_pathfinder_reads_pixels_labels_and_splits_80_10_10(tmp_path):
    written = _pathfinder(tmp_path, 32, "curv_contour_length_14", files=3, per_file=7)
    (tmp_path / "pathfinder32" / "curv_contour_length_14" / "imgs" / "1" / "sample_2.png").write_bytes(b"")  # as the release's empty one
    with pytest.warns(UserWarning, match=r"skipped 1 empty or undecodable images of 21 \(first: .*imgs/1/sample_2.png\)"):
        data = load_data(f"lra-pathfinder:{tmp_path}", 0, seed=5)
    assert (data.vocab_size, data.num_classes, data.grid) == (256, 2, (32, 32))
    assert (len(data.train), len(data.val), len(data.test)) == (16, 2, 2)
    expected = {pixels.tobytes(): label for name, (pixels, label) in written.items() if name != "imgs/1/sample_2.png"}
    seen = []
    for split in (data.train, data.val, data.test):
        for tokens, label in zip(_all_tokens(split), split.labels.tolist(), strict=True):
            assert expected[tokens] == label
            seen.append(tokens)
    assert sorted(seen) == sorted(expected)
    with pytest.warns(UserWarning):
        again = load_lra_pathfinder(tmp_path / "pathfinder32", difficulty="curv_contour_length_14", seed=5)  # DIR may be pathfinder32
    assert again.test.tokens.equal(data.test.tokens)


def test_pathfinder_options_select_resolution_difficulty_and_metadata_files(tmp_path):
    written = _pathfinder(tmp_path, 64, "curv_baseline", files=12, per_file=2)
    data = load_data(f"lra-pathfinder:{tmp_path}:resolution=64:difficulty=easy:limit=10", 0)
    first_ten = {pixels.tobytes() for name, (pixels, _) in written.items() if int(name.split("/")[1]) < 10}  # by number: not 10.npy
    assert data.grid == (64, 64) and {t for s in (data.train, data.val, data.test) for t in _all_tokens(s)} == first_ten
    assert data.train.lengths().unique().tolist() == [64 * 64]
    with pytest.raises(ValueError, match=r"lra-pathfinder: 2 examples are too few to hold out fractions \[0.1, 0.1\]"):
        load_data(f"lra-pathfinder:{tmp_path}:resolution=64:difficulty=easy:limit=1", 0)
    with pytest.raises(ValueError, match=r"pathfinder64/curv_contour_length_14/metadata is missing; expected the release's pathfinder64"):
        load_data(f"lra-pathfinder:{tmp_path}:resolution=64", 0)
    with pytest.raises(ValueError, match=r"difficulty must be one of \['easy', 'intermediate', 'hard'"):
        load_data(f"lra-pathfinder:{tmp_path}:difficulty=medium", 0)
    with pytest.raises(ValueError, match=r"resolution must be one of \[32, 64, 128, 256\]"):
        load_data(f"lra-pathfinder:{tmp_path}:resolution=48", 0)
    with pytest.raises(ValueError, match="resolution='x' must be an integer"):
        load_data(f"lra-pathfinder:{tmp_path}:resolution=x", 0)
    (tmp_path / "pathfinder32").symlink_to(tmp_path / "pathfinder64")
    with pytest.raises(ValueError, match="is 64 x 64 pixels, not 32 x 32"):
        load_data(f"lra-pathfinder:{tmp_path}:difficulty=easy", 0)


def test_pathfinder_refuses_absent_images_and_broken_metadata(tmp_path):
    _pathfinder(tmp_path, 32, "curv_contour_length_9", files=2, per_file=3)
    base = tmp_path / "pathfinder32" / "curv_contour_length_9"
    (base / "imgs" / "1" / "sample_0.png").unlink()
    with pytest.raises(ValueError, match=r"imgs/1/sample_0.png is missing"):
        load_data(f"lra-pathfinder:{tmp_path}:difficulty=intermediate", 0)
    (base / "metadata" / "1.npy").write_text("imgs/1 sample_0.png 0\n")
    with pytest.raises(ValueError, match=r"metadata/1.npy line 1: expected 'imgs/<k> sample_<i>.png"):
        load_data(f"lra-pathfinder:{tmp_path}:difficulty=intermediate", 0)
    for path in (base / "metadata").iterdir():
        path.unlink()
    with pytest.raises(ValueError, match=r"holds no <k>.npy files"):
        load_data(f"lra-pathfinder:{tmp_path}:difficulty=intermediate", 0)


def test_every_lra_source_needs_a_directory_that_exists(tmp_path):
    for name in ("lra-text", "lra-retrieval", "lra-image", "lra-pathfinder"):
        with pytest.raises(ValueError, match=f"{name} needs the directory of its files: {name}:DIR"):
            load_data(name, 0)
        with pytest.raises(ValueError, match=f"{name}: directory .*nowhere does not exist; expected"):
            load_data(f"{name}:{tmp_path / 'nowhere'}", 0)
