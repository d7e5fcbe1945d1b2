"""Language benchmarks end to end: BPE runs (train, eval, generate), GLUE tasks, fine-tuning."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from glue_fixture import BAD, GOOD, write_glue

import tokenmix
from tokenmix.cli import main
from tokenmix.cli.generate import TextStream
from tokenmix.data.sources import load_data
from tokenmix.data.tokenizer import byte_tokenizer, train_bpe
from tokenmix.generation import StopRule, naive_generate
from tokenmix.models import ModelConfig, SequenceModel
from tokenmix.runs import open_run
from tokenmix.runs.checkpoint import load_checkpoint

SIZES = ["--dim", "16", "--depth", "1", "--seq-len", "32", "--batch-size", "4", "--eval-tokens", "256", "-o", "rpe_dim=4"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return tmp_path_factory.mktemp("language")


@pytest.fixture(scope="module")
def corpus(shared):
    path = shared / "corpus.txt"
    lines = [f"The {word} play was {other}, said the player.\n" for word in GOOD + BAD for other in GOOD + BAD]
    path.write_text("".join(lines * 6))
    return str(path)


@pytest.fixture(scope="module")
def glue(shared):
    """SST-2 and STS-B in the GLUE release layout: a sentiment word decides the label or the score."""
    return write_glue(shared / "glue")


@pytest.fixture(scope="module")
def bpe_lm(corpus, shared):
    """A causal LM of BPE tokens trained by the command line, long enough (30 steps) to learn where commas go."""
    out = shared / "lm"
    flags = ["--data", corpus, "--tokenizer", "bpe:300", *SIZES, "--steps", "30", "--lr", "1e-2", "--sample-tokens", "5"]
    assert main(["train", *flags, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def pretrained(corpus, shared):
    """A masked LM of BPE tokens (3 steps): the model the fine-tuning tests start from (none changes it)."""
    out = shared / "mlm"
    flags = ["--data", corpus, "--tokenizer", "bpe:300", "--task", "mlm", *SIZES, "--steps", "3"]
    assert main(["train", *flags, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def sst2(pretrained, glue, shared):
    """The masked LM fine-tuned on SST-2 (60 steps: enough to learn the one word that decides the label)."""
    out = shared / "sst2"
    finetune = ["finetune", str(pretrained), "--data", f"glue-sst2:{glue}", "--steps", "60", "--lr", "3e-3", "--eval-every", "30"]
    assert main([*finetune, "--batch-size", "16", "--out", str(out)]) == 0
    return out


def test_a_bpe_run_keeps_its_tokenizer_and_eval_reports_bits_per_byte(bpe_lm, corpus, tmp_path, capsys):
    out = bpe_lm
    assert (out / "tokenizer.json").is_file() and (out / "model" / "tokenizer.json").is_file()
    run = open_run(out)
    assert run.tokenizer.name == "bpe:300" and run.config.vocab_size == 300 and run.settings["tokenizer"] == "bpe:300"
    capsys.readouterr()
    assert main(["eval", str(out), "--json", str(tmp_path / "eval.json")]) == 0
    table = capsys.readouterr().out
    assert "bpe:300 tokens" in table and "bpb" in table and "word_ppl" in table
    (row,) = json.loads((tmp_path / "eval.json").read_text())["results"]
    assert row["bytes"] > 2 * row["tokens"] and row["bpb"] < row["loss"] / 0.6931  # a BPE token spells several bytes
    assert row["words"] == len(open(corpus, "rb").read()[-row["bytes"] :].split())  # the words of the text its targets spell


def test_generate_with_a_bpe_run_decodes_text_and_honours_a_stop_string(bpe_lm, capsys):
    out = bpe_lm
    capsys.readouterr()
    assert (
        main(["generate", str(out), "--prompt", "The good play", "--temperature", "0", "--max-new-tokens", "60", "--stop", ",", "--check"])
        == 0
    )
    captured = capsys.readouterr()
    text = captured.out.rstrip("\n")
    assert text.startswith("The good play") and text.endswith(",") and text.count(",") == 1
    assert "agree on every token" in captured.err
    assert (
        main(["generate", str(out), "--prompt", "The good play", "--temperature", "0", "--max-new-tokens", "60", "--stop", ",", "--stream"])
        == 0
    )
    assert capsys.readouterr().out.rstrip("\n") == text  # streamed text stops at the same place


def test_a_stop_string_ends_the_row_on_the_token_that_completes_it():
    tokenizer = train_bpe(("ab\n\ncd\n\n" * 50).encode(), 300)
    ids = tokenizer.encode(b"ab\n\ncd").tolist()
    rule = StopRule("\n", tokenizer.vocab_size, tokenizer)
    ends = [index for index in range(1, len(ids) + 1) if rule.reached(ids[:index])]
    assert tokenizer.decode(ids[: ends[0]]).startswith(b"ab\n") and b"\n" not in tokenizer.decode(ids[: ends[0] - 1])
    assert rule.cut(b"ab\n\ncd") == b"ab\n"
    byte_rule = StopRule("d\n", 256)
    assert [byte_rule.reached(list(b"cd\n"[:n])) for n in range(1, 4)] == [False, False, True]
    with pytest.raises(ValueError, match="stop as a string needs the model's tokenizer"):
        StopRule("x", 300)


def test_streamed_text_ends_with_the_stop_text_inside_a_token(capsys):
    stream = TextStream(StopRule("\n", 256))
    for piece in (b"ab", b"c\n\nd", b"ef"):  # the token that completes the stop carries more text
        stream.write_sample(piece)
    assert capsys.readouterr().out == "abc\n"


def test_cached_generation_with_a_text_stop_equals_recomputing():
    tokenizer = train_bpe(("one two, three four.\n" * 40).encode(), 300)
    torch.manual_seed(0)
    model = SequenceModel(ModelConfig("tnn", "lm", vocab_size=300, dim=16, depth=1, options={"rpe_dim": 4})).eval()
    prompts = [tokenizer.encode(text).long() for text in ("one", "three four")]
    cached = tokenmix.generate(model, prompts, 40, temperature=0, stop=" t", tokenizer=tokenizer)
    for prompt, new in zip(prompts, cached, strict=True):
        assert torch.equal(new, naive_generate(model, prompt, 40, " t", tokenizer))


def test_glue_sources_tokenize_pairs_hold_out_validation_and_refuse_bad_options(glue):
    sst2 = load_data(f"glue-sst2:{glue}", 0, seed=0)
    assert (len(sst2.train), len(sst2.val), len(sst2.test)) == (380, 20, 80) and sst2.num_classes == 2 and sst2.glue_task == "sst2"
    assert byte_tokenizer().decode(sst2.test.sequence(0).tolist()).startswith(b"the play was ")
    stsb = load_data(f"glue-stsb:{glue}:max_length=9", 0, seed=0, tokenizer="bpe:300")
    assert stsb.num_classes == 1 and stsb.test.labels.dtype == torch.float32 and stsb.tokenizer.name == "bpe:300"
    separator = stsb.tokenizer.end_of_document_id
    assert all(len(stsb.test.sequence(i)) <= 9 and separator in stsb.test.sequence(i).tolist() for i in range(5))
    for source, message in [
        (f"glue-sst3:{glue}", "unknown GLUE task 'sst3'; accepted: glue-cola"),
        (f"glue-sst2:{glue}:dev=mismatched", "dev=mismatched applies to glue-mnli only"),
        (f"glue-sst2:{glue}:max_length=2", "max_length must be at least 3"),
        (f"glue-sst2:{glue}:size=2", "unknown options \\['size'\\]"),
        (f"glue-rte:{glue}", "neither .* holds train.tsv"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_data(source, 0)
    with pytest.raises(ValueError, match="has its own token ids; --tokenizer applies to text corpora and GLUE"):
        load_data("listops:train=10:val=10:test=10", 0, tokenizer="bpe:300")


def test_mlm_pretraining_then_finetuning_on_glue(pretrained, sst2, glue, tmp_path, capsys):
    state = load_checkpoint(sst2)
    assert state["train_config"]["init"] == str(pretrained) and state["train_config"]["tokenizer"].startswith("bpe:")
    assert state["tokenizer"] == load_checkpoint(pretrained)["tokenizer"]  # the pretrained model's ids
    assert state["model_config"]["task"] == "classify" and state["model_config"]["num_classes"] == 2
    capsys.readouterr()
    assert main(["eval", str(sst2), "--json", str(tmp_path / "glue.json")]) == 0
    rows = {row["split"]: row for row in json.loads((tmp_path / "glue.json").read_text())["results"]}
    assert rows["test"]["examples"] == 80 and rows["test"]["accuracy"] > 0.9  # one word decides the label
    stsb = tmp_path / "stsb"
    assert main(["finetune", str(pretrained), "--data", f"glue-stsb:{glue}", "--steps", "2", "--out", str(stsb)]) == 0
    assert main(["eval", str(stsb), "--json", str(tmp_path / "stsb.json")]) == 0
    row = json.loads((tmp_path / "stsb.json").read_text())["results"][-1]
    assert {"pearson", "spearman"} <= set(row) and "accuracy" not in row


def test_finetuning_starts_from_the_pretrained_weights(pretrained, glue, tmp_path):
    out = tmp_path / "ft"
    assert main(["finetune", str(pretrained), "--data", f"glue-sst2:{glue}", "--steps", "1", "--lr", "1e-12", "--out", str(out)]) == 0
    before, after = load_checkpoint(pretrained)["model"], load_checkpoint(out)["model"]
    assert set(after) - set(before) == {"classifier.weight", "classifier.bias"}
    for name, value in before.items():  # a step of lr 1e-12 leaves every pretrained weight where it was
        assert torch.allclose(after[name], value, atol=1e-9), name


def test_finetuning_a_copied_checkpoint_reads_its_tokenizer_from_it_and_writes_runs_finetune(pretrained, glue, tmp_path, monkeypatch):
    (tmp_path / "copy").mkdir()
    shutil.copy(pretrained / "checkpoint.pt", tmp_path / "copy" / "checkpoint.pt")  # no tokenizer.json beside it
    monkeypatch.chdir(tmp_path)
    assert main(["finetune", "copy/checkpoint.pt", "--data", f"glue-sst2:{glue}", "--steps", "1"]) == 0
    state = load_checkpoint(tmp_path / "runs" / "finetune")
    assert state["tokenizer"] == load_checkpoint(pretrained)["tokenizer"] and state["model_config"]["vocab_size"] == 300
    assert main(["finetune", "copy", "--resume", "--steps", "2"]) == 0  # resumes runs/finetune, its default --out
    assert load_checkpoint(tmp_path / "runs" / "finetune")["step"] == 2


def test_finetune_refuses_what_it_cannot_start_from(corpus, glue, bpe_lm, pretrained, tmp_path, capsys):
    """Refused: a classifier (trained by ``train --task classify``), a missing run, a masked LM without
    classification data, and a causal LM on a classification task; the shared runs are only read."""
    causal, masked, classifier = bpe_lm, pretrained, tmp_path / "classifier"
    sst2 = ["--data", f"glue-sst2:{glue}"]
    assert main(["train", *sst2, "--task", "classify", *SIZES, "--steps", "1", "--out", str(classifier)]) == 0
    for arguments, message in [
        ([str(classifier), *sst2], "starts from a masked LM (task mlm: a classifier follows) or a causal language model"),
        ([str(tmp_path / "missing"), *sst2], "does not exist"),
        ([str(masked)], "finetune needs --data: the classification task"),
        ([str(masked), "--data", corpus], "is not a classification task"),
        ([str(causal), *sst2], "a causal language model is fine-tuned on text"),
    ]:
        capsys.readouterr()
        with pytest.raises(SystemExit):
            main(["finetune", *arguments, "--out", str(tmp_path / "ft")])
        error = capsys.readouterr().err
        assert message in error and "--task" not in error  # finetune has no --task flag to suggest
    with pytest.raises(SystemExit):  # a masked LM starts masked-LM or classification runs, not a causal LM
        main(["train", "--data", corpus, *SIZES, "--steps", "1", "--init", str(masked), "--task", "lm", "--out", str(tmp_path / "x")])
    error = capsys.readouterr().err
    assert "init: a model pretrained with task 'mlm'" in error and "starts runs of task 'mlm' or 'classify', not 'lm'" in error
    with pytest.raises(SystemExit):
        main(["finetune", str(causal), "--model", "mega"])  # the model comes from the pretrained run: no such flag
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["finetune", str(causal), "--resume", "--out", str(causal)])
    assert "is not a fine-tuning run; continue it with `tokenmix train --resume`" in capsys.readouterr().err
