"""Tokenizers (bytes, byte-level BPE, saved files), the token cache, and bits per byte."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers

from tokenmix.data.cache import cache_directory
from tokenmix.data.corpus import ByteCorpus, as_tensor
from tokenmix.data.tokenized import TokenCorpus, resolve_tokenizer, tokenize_corpus
from tokenmix.data.tokenizer import MIN_BPE_VOCAB, Tokenizer, byte_tokenizer, parse_tokenizer_spec, train_bpe
from tokenmix.models import ModelConfig, SequenceModel
from tokenmix.train.evaluate import evaluate_lm, evaluate_mlm
from tokenmix.train.objectives import objective_for

TEXT = ("Thou art more lovely and more temperate. Café, naïve — “quoted” 日本語.\nRough winds do shake the buds of May,\n" * 40).encode()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return train_bpe(TEXT, 320)


def test_bytes_are_their_own_ids_through_the_tokenizers_library_too():
    tokenizer = byte_tokenizer()
    assert tokenizer.is_bytes and tokenizer.vocab_size == 256 and tokenizer.mask_id == 256 and tokenizer.name == "bytes"
    assert torch.equal(tokenizer.encode(TEXT), as_tensor(TEXT))
    assert tokenizer.backend.encode(TEXT.decode()).ids == list(TEXT)  # a saved bytes tokenizer gives the same ids anywhere
    assert tokenizer.decode(list(TEXT)) == TEXT
    assert tokenizer.model_vocab_size("lm") == 256 and tokenizer.model_vocab_size("mlm") == 257


def test_bpe_round_trip_train_save_load_same_ids(bpe, tmp_path):
    ids = bpe.encode(TEXT)
    assert bpe.vocab_size == 320 and not bpe.is_bytes and bpe.name == "bpe:320"
    assert len(ids) < len(TEXT) / 2  # merges learnt
    assert bpe.decode(ids.tolist()) == TEXT  # exact, non-ASCII included
    assert int(bpe.byte_lengths[ids.long()].sum()) == len(TEXT)
    bpe.save(tmp_path)
    loaded = Tokenizer.load(tmp_path / "tokenizer.json")
    assert loaded == bpe and torch.equal(loaded.encode(TEXT), ids)
    assert (loaded.end_of_document_id, loaded.pad_id, loaded.mask_id) == (0, 1, 2)
    assert train_bpe(TEXT, 320).to_json() == bpe.to_json()  # learning is deterministic


def test_decoding_is_exact_for_any_ids_even_mid_character(bpe):
    ids = bpe.encode("日本語".encode()).tolist()
    pieces = [bpe.decode([i]) for i in ids]
    assert b"".join(pieces) == "日本語".encode()
    assert bpe.decode([0, 1, 2]) == b""  # special tokens stand for no text


def test_a_gpt2_style_file_is_read_and_a_non_byte_level_one_refused(tmp_path, bpe):
    gpt2 = json.loads(bpe.to_json())
    gpt2["added_tokens"] = [dict(gpt2["added_tokens"][0], content="<|endoftext|>")]
    vocab = {token: index for token, index in gpt2["model"]["vocab"].items() if token not in ("</s>", "<pad>", "<mask>")}
    gpt2["model"]["vocab"] = {"<|endoftext|>": 0, **vocab}
    (tmp_path / "gpt2.json").write_text(json.dumps(gpt2))
    loaded = Tokenizer.load(tmp_path / "gpt2.json")
    assert loaded.end_of_document_id == 0 and loaded.mask_id is None and loaded.pad_id is None
    with pytest.raises(ValueError, match="has no <mask> token, which task 'mlm' needs"):
        loaded.model_vocab_size("mlm")
    words = Backend(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "words.json").write_text(words.to_str())
    with pytest.raises(ValueError, match="is not byte level \\(its decoder is not ByteLevel\\)"):
        Tokenizer.load(tmp_path / "words.json")
    gpt2["model"]["vocab"]["日本"] = len(gpt2["model"]["vocab"])  # a token outside the byte-level alphabet
    (tmp_path / "odd.json").write_text(json.dumps(gpt2))
    with pytest.raises(ValueError, match="is not byte level: token '日本'"):
        Tokenizer.load(tmp_path / "odd.json")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bpe:100", f"needs an integer VOCAB >= {MIN_BPE_VOCAB}"),
        ("bpe:x", "needs an integer VOCAB"),
        ("", "tokenizer must be bytes, bpe:VOCAB or a tokenizer.json path"),
    ],
)
def test_bad_tokenizer_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_tokenizer_spec(spec)


def test_special_token_names_in_a_text_are_text(bpe):
    text = b"<p>x </s> y <mask>z<pad></p>"
    ids = bpe.encode(text)
    assert bpe.decode(ids.tolist()) == text and not {0, 1, 2} & set(ids.tolist())


def test_bad_files_and_text(tmp_path, bpe):
    with pytest.raises(ValueError, match="'sentencepiece' does not exist; give bytes, bpe:VOCAB or a tokenizer.json file"):
        resolve_tokenizer("sentencepiece")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a tokenizers JSON file"):
        Tokenizer.load(tmp_path / "broken.json")
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="invalid UTF-8 at byte 2: use --tokenizer bytes"):
        bpe.encode(b"ab\xff")
    with pytest.raises(ValueError, match="invalid UTF-8 at byte 1"):
        train_bpe(b"a\xfe", 300)


def test_a_second_run_reads_the_bpe_and_the_ids_from_the_cache(cache):
    corpus = ByteCorpus("fixture", as_tensor(TEXT), as_tensor(TEXT[:500]), as_tensor(TEXT[500:900]))
    first = resolve_tokenizer("bpe:300", TEXT)
    tokenized = tokenize_corpus(corpus, first)
    assert all("cached" in note and "from the cache" not in note for note in tokenized.notes)
    assert len(list((cache / "bpe").iterdir())) == 1 and len(list((cache / "tokens").iterdir())) == 3
    again = tokenize_corpus(corpus, resolve_tokenizer("bpe:300", TEXT))
    assert all("read from the cache" in note for note in again.notes)
    assert all(torch.equal(tokenized.split(name), again.split(name)) for name in ("train", "val", "test"))
    other = tokenize_corpus(corpus, resolve_tokenizer("bpe:301", TEXT))  # another tokenizer: another entry, never a stale one
    assert not any("read from the cache" in note for note in other.notes) and len(list((cache / "tokens").iterdir())) == 6
    assert cache_directory() == cache


@torch.no_grad()
def _nll_by_hand(model, data: torch.Tensor, length: int) -> float:
    """Summed next-token loss over non-overlapping windows, one window at a time."""
    total = 0.0
    for start in range(0, data.numel() - 1, length):
        window = data[start : start + length + 1].long()
        logits = model(window[None, :-1])[0]
        total += float(torch.nn.functional.cross_entropy(logits, window[1:], reduction="sum"))
    return total


@pytest.mark.parametrize("length", [7, 16])
def test_bits_per_byte_is_the_total_loss_over_the_bytes_the_targets_spell(bpe, length):
    torch.manual_seed(0)
    model = SequenceModel(ModelConfig("tnn", "lm", vocab_size=bpe.vocab_size, dim=16, depth=1, options={"rpe_dim": 4})).eval()
    data = bpe.encode(TEXT[:700])
    metrics = evaluate_lm(model, data, length, batch_size=3, byte_lengths=bpe.byte_lengths)
    spelled = len(bpe.decode(data[1:].tolist()))
    assert metrics["tokens"] == data.numel() - 1 and metrics["bytes"] == spelled < 700
    total = _nll_by_hand(model, data, length)
    assert metrics["bpb"] == pytest.approx(total / math.log(2) / spelled, rel=1e-5)
    assert metrics["loss"] == pytest.approx(total / metrics["tokens"], rel=1e-5)
    as_bytes = evaluate_lm(model, data, length, batch_size=3)  # no table: one byte per token, bits per token
    assert as_bytes["bpb"] == pytest.approx(as_bytes["loss"] / math.log(2), rel=1e-6)


def test_masked_lm_bits_per_byte_count_the_masked_tokens_bytes(bpe):
    torch.manual_seed(0)
    model = SequenceModel(ModelConfig("tnn", "mlm", vocab_size=bpe.vocab_size, dim=16, depth=1, options={"rpe_dim": 4})).eval()
    data = bpe.encode(TEXT[:2000])
    metrics = evaluate_mlm(model, data, 32, bpe.mask_id, vocab_size=bpe.vocab_size, byte_lengths=bpe.byte_lengths)
    assert 0 < metrics["tokens"] < data.numel() / 4
    assert metrics["bytes"] > metrics["tokens"]  # BPE tokens are longer than a byte on average
    assert metrics["bpb"] == pytest.approx(metrics["loss"] * metrics["tokens"] / math.log(2) / metrics["bytes"], rel=1e-9)


def test_word_perplexity_counts_the_words_of_the_predicted_text():
    data = as_tensor(b"alpha beta gamma d")
    corpus = TokenCorpus("fixture", byte_tokenizer(), data, data, data)
    torch.manual_seed(0)
    model = SequenceModel(ModelConfig("tnn", "lm", vocab_size=256, dim=16, depth=1, options={"rpe_dim": 4})).eval()
    metrics = objective_for(corpus, "lm").evaluate(model, "test", length=8)
    assert metrics["words"] == 4  # "lpha beta gamma d": every byte but the first is predicted
    assert metrics["word_ppl"] == pytest.approx(math.exp(metrics["loss"] * metrics["tokens"] / 4))
