"""The associative-recall data source and its training / evaluation path."""

import json
import re

import pytest
import torch

from tokenmix.cli import main
from tokenmix.data import AssociativeRecall, load_data, recall_examples, step_generator
from tokenmix.data.recall import NO_OP, QUERY
from tokenmix.runs.metrics import TRAINING_COST, training_cost
from tokenmix.train import TrainConfig, Trainer


@pytest.mark.parametrize(("vocab", "length"), [(10, 64), (20, 1024), (4, 5), (7, 4)])
def test_examples_follow_the_generator_rules(vocab, length):
    tokens = recall_examples(50, vocab, length, torch.Generator().manual_seed(1))
    assert tokens.shape == (50, length + 1)
    keys = range(2, 2 + (vocab - 2) // 2)
    body = tokens[:, length % 2 : -3]
    assert (tokens[:, : length % 2] == NO_OP).all() and (tokens[:, -3] == QUERY).all()
    for row, pairs in zip(tokens, body.view(50, -1, 2), strict=True):
        assert all(int(k) in keys and int(v) >= keys.stop and int(v) < vocab for k, v in pairs)
        mapping = {int(k): int(v) for k, v in pairs}
        assert len({(int(k), int(v)) for k, v in pairs}) == len(mapping)  # one value per key within an example
        assert mapping[int(row[-2])] == int(row[-1])  # the asked key occurred, and its value is the answer


@pytest.mark.parametrize(("pairs", "length"), [(1, 4), (3, 100), (16, 1000)])
def test_pairs_come_first_and_the_answer_lies_far_back(pairs, length):
    """``pairs=K``: K pairs, then no-ops up to the query, whose key is one of the K."""
    tokens = recall_examples(30, 20, length, torch.Generator().manual_seed(2), pairs)
    assert tokens.shape == (30, length + 1)
    assert (tokens[:, 2 * pairs : -3] == NO_OP).all() and (tokens[:, -3] == QUERY).all()
    for row in tokens:
        mapping = {int(k): int(v) for k, v in row[: 2 * pairs].view(-1, 2)}
        assert NO_OP not in mapping and mapping[int(row[-2])] == int(row[-1])


def test_too_many_pairs_are_refused():
    assert load_data("assoc-recall:vocab=20,pairs=4", 64).source == "assoc-recall:vocab=20,pairs=4"
    with pytest.raises(ValueError, match=r"assoc-recall pairs \(at most \(--seq-len - 2\) // 2 = 31\) must be an integer in \[1, 31\]"):
        load_data("assoc-recall:pairs=32", 64)
    with pytest.raises(ValueError, match=r"the accepted form is assoc-recall\[:vocab=V\]\[,pairs=K\]"):
        load_data("assoc-recall:gap=3", 64)


def test_splits_are_fixed_per_seed_and_apart_from_training():
    task = AssociativeRecall(10, 64, seed=3, eval_examples=20)
    val, test = task.split("val"), task.split("test")
    assert torch.equal(val[0], task.split("val")[0]) and not torch.equal(val[0], test[0])
    assert not torch.equal(test[0], AssociativeRecall(10, 64, seed=4, eval_examples=20).split("test")[0])
    inputs, targets = task.batch(20, step_generator(3, 0))
    assert inputs.shape == targets.shape == (20, 64) and torch.equal(inputs[:, 1:], targets[:, :-1])
    assert not torch.equal(inputs, test[0])


def test_data_argument_forms():
    assert load_data("assoc-recall", 64).vocab_size == 10
    assert load_data("assoc-recall:vocab=20", 128).length == 128
    for bad in ("assoc-recall:size=20", "assoc-recall:vocab=x", "assoc-recall:vocab=3"):
        with pytest.raises(ValueError, match="vocab"):
            load_data(bad, 64)
    with pytest.raises(ValueError, match="length"):
        load_data("assoc-recall", 3)


def test_training_on_recall_learns_and_reports_last_position_accuracy(tmp_path, capsys):
    config = TrainConfig(
        model="tcnca_simple", data="assoc-recall", dim=16, depth=1, seq_len=16, batch_size=8, steps=2,
        warmup=0, eval_every=2, eval_tokens=160, out=str(tmp_path / "ar"), options={"chunk_size": 8},
    )  # fmt: skip
    trainer = Trainer(config, progress=False)
    assert trainer.model.config.vocab_size == 10
    assert trainer.evaluate("val", max_tokens=160)["examples"] == 10
    final = trainer.run()
    assert 0.0 <= final["accuracy"] <= 1.0 and final["examples"] == 1000
    assert 0 < final["session_minutes"] < 10 and 0.01 < final["peak_memory_gb"] < 64  # the cost of training, measured
    assert 0.5 < final["estimated_peak_gb"] / final["peak_memory_gb"] < 2  # and the estimate made before it
    assert main(["eval", str(tmp_path / "ar"), "--split", "test", "--lengths", "16,32"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "assoc-recall" in out and len([line for line in out.splitlines() if "1000" in line]) == 2
    report = tmp_path / "both.json"
    assert main(["eval", str(tmp_path / "ar"), str(tmp_path / "ar"), "--split", "test", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "2 runs on assoc-recall" in out and "train_min" in out and f"{final['peak_memory_gb']:.2f}" in out
    assert f"{final['estimated_peak_gb']:.2f}" in out and "est_peak_gb: the last training session's peak memory estimated" in out
    cost = training_cost(tmp_path / "ar")  # the final record of metrics.jsonl
    assert set(cost) == set(TRAINING_COST) and {key: cost[key] for key in ("session_minutes", "peak_memory_gb")} == {
        key: final[key] for key in ("session_minutes", "peak_memory_gb")
    }
    assert re.search(rf"\|\s+{cost['step']} \|", out) and f"{cost['seconds_per_step']:.3f}" in out
    assert "s_per_step: the last training session's" in out
    both = json.loads(report.read_text())
    assert both[0]["training"] == cost
    accuracies = [run["results"][0]["accuracy"] for run in both]
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1]


def test_eval_refuses_one_table_of_recall_and_corpus_runs(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question. " * 40)
    for name, data in (("ar", "assoc-recall"), ("lm", str(corpus))):
        config = TrainConfig(
            model="tcnca_simple", data=data, dim=8, depth=1, seq_len=16, batch_size=2, steps=1, warmup=0,
            eval_every=1, eval_tokens=64, out=str(tmp_path / name), options={"chunk_size": 8},
        )  # fmt: skip
        Trainer(config, progress=False).run()
    with pytest.raises(SystemExit):
        main(["eval", str(tmp_path / "ar"), str(tmp_path / "lm"), "--lengths", "16"])
    assert "share a kind of data" in capsys.readouterr().err


def test_recall_accuracy_counts_the_last_position_only(tmp_path):
    """A model that always outputs the right answer at the end scores 100 %, whatever it does before."""
    from tokenmix.train.evaluate import evaluate_recall

    inputs, targets = AssociativeRecall(10, 16, eval_examples=30).split("test")

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, tokens):
            logits = torch.zeros(tokens.shape[0], tokens.shape[1], 10)  # wrong everywhere but at the end
            logits[:, -1].scatter_(1, targets[:, -1:], 10.0)
            return logits

    assert evaluate_recall(Oracle(), inputs, targets, batch_size=30)["accuracy"] == 1.0


@pytest.mark.parametrize(("overrides", "message"), [({"task": "mlm"}, "--task lm"), ({"model": "transformer_xl"}, "segment-recurrent")])
def test_recall_rejects_tasks_and_models_it_cannot_serve(tmp_path, overrides, message):
    config = TrainConfig(data="assoc-recall", dim=16, depth=1, seq_len=16, steps=1, out=str(tmp_path), **overrides)
    with pytest.raises(ValueError, match=message):
        Trainer(config, progress=False)
