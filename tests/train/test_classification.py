"""Classification heads (pooling, the dual encoder), ragged examples, and the classification objective."""

import json
from dataclasses import replace

import pytest
import torch

import tokenmix
from tokenmix.cli import main
from tokenmix.data import load_data
from tokenmix.data.examples import ClassificationData, Examples
from tokenmix.models.config import POOLS
from tokenmix.models.model import pool_hidden
from tokenmix.train.config import TrainConfig
from tokenmix.train.loop import Trainer
from tokenmix.train.metrics import binomial_tail
from tokenmix.train.objectives import Classification, objective_for


def loop_pool(h, mask, how):
    """Pooling one row at a time over the real positions (the reference)."""
    rows = []
    for row in range(h.shape[0]):
        real = h[row][mask[row]]
        rows.append({"mean": real.mean(dim=0), "first": real[0], "last": real[-1]}[how])
    return torch.stack(rows)


@pytest.mark.parametrize("how", POOLS)
def test_pooling_equals_a_loop_over_real_tokens(how):
    h = torch.randn(4, 9, 5, dtype=torch.float64)
    mask = torch.ones(4, 9, dtype=torch.bool)
    mask[0, 6:] = False  # right padding
    mask[1, :3] = False  # left padding
    mask[2, :2] = mask[2, 7:] = False  # both
    torch.testing.assert_close(pool_hidden(h, mask, how), loop_pool(h, mask, how), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pool_hidden(h, None, how), loop_pool(h, torch.ones(4, 9, dtype=torch.bool), how))


def test_dual_encoder_classifies_u_v_and_their_products():
    """Both documents through the same blocks, each pooled alone; the MLP reads [u, v, u*v, u-v]."""
    torch.manual_seed(0)
    net = tokenmix.build_model("tnn", task="classify", vocab_size=20, dim=8, depth=2, num_classes=2, documents=2, rpe_dim=4).double().eval()
    tokens = torch.randint(0, 20, (3, 2, 11))
    mask = torch.ones(3, 2, 11, dtype=torch.bool)
    mask[0, 1, 6:] = False
    mask[2, 0, 4:] = False
    logits = net(tokens, mask)
    for row in range(3):
        u, v = (net.hidden_states(tokens[row, d][mask[row, d]][None])[0].mean(dim=1)[0] for d in range(2))
        expected = net.classifier(torch.cat([u, v, u * v, u - v]))
        torch.testing.assert_close(logits[row], expected, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match=r"tokens must be \(batch, 2, length\)"):
        net(tokens[:, 0])


def test_classification_head_options_are_checked():
    with pytest.raises(ValueError, match="pool must be one of"):
        tokenmix.build_model("tnn", task="classify", vocab_size=20, num_classes=2, pool="max")
    with pytest.raises(ValueError, match="documents must be an integer in"):
        tokenmix.build_model("tnn", task="classify", vocab_size=20, num_classes=2, documents=3)
    with pytest.raises(ValueError, match="classification head; task='lm' has none"):
        tokenmix.build_model("tnn", vocab_size=20, pool="first")
    net = tokenmix.build_model("tnn", task="classify", vocab_size=20, dim=8, depth=1, num_classes=2)
    with pytest.raises(ValueError, match="a classifier reads whole examples"):
        net(torch.zeros(1, 4, dtype=torch.long), return_state=True)


def test_examples_batch_pads_right_and_keeps_every_document():
    sequences = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]
    single = Examples.from_sequences(sequences, [0, 1, 0, 1])
    tokens, mask, labels = single.batch([3, 1])
    assert tokens.tolist() == [[7, 8, 9, 10], [4, 0, 0, 0]] and mask.sum(1).tolist() == [4, 1] and labels.tolist() == [1, 1]
    assert single.batch([1], length=3)[0].tolist() == [[4, 0, 0]]
    with pytest.raises(ValueError, match="shorter than the longest"):
        single.batch([0], length=2)
    pairs = Examples.from_sequences(sequences, [1, 0], documents=2)
    tokens, mask, labels = pairs.batch([1, 0])
    assert tokens.shape == (2, 2, 4) and tokens[0, 1].tolist() == [7, 8, 9, 10] and tokens[1, 1].tolist() == [4, 0, 0, 0]
    assert pairs.subset(torch.tensor([1])).sequence(0, 1).tolist() == [7, 8, 9, 10] and pairs.lengths().tolist() == [[3, 1], [2, 4]]


def test_majority_accuracy_is_the_floor_of_always_answering_the_commonest_training_label():
    train = Examples.from_sequences([[1]] * 4, [2, 2, 1, 0])
    test = Examples.from_sequences([[1]] * 4, [2, 0, 0, 2])
    data = ClassificationData("toy", 3, 3, train, test, test)
    assert data.majority_accuracy("test") == 0.5


def train_and_evaluate(data: str, out, capsys, *extra: str) -> str:
    """Train a tiny classifier through the command line, then `tokenmix eval` it; the eval output."""
    common = ["--task", "classify", "--data", data, "--dim", "16", "--depth", "1", "--batch-size", "4", "--eval-every", "2"]
    assert main(["train", "--model", "tnn", *common, "--steps", "3", "-o", "rpe_dim=4", "--out", str(out), *extra]) == 0
    assert "validation: loss" in capsys.readouterr().out
    assert main(["eval", str(out)]) == 0
    return capsys.readouterr().out


def test_classification_trains_and_evaluates_val_and_test_with_the_majority_floor(tmp_path, capsys):
    data = "listops:max_length=40:train=60:val=20:test=30"
    out = train_and_evaluate(data, tmp_path / "r", capsys, "--pool", "last")
    rows = [line for line in out.splitlines() if line.startswith("|") and ("val" in line or "test" in line)]
    assert len(rows) == 2 and "majority_class" in out and "on the val and test splits" in out
    listops = load_data(data, 0)
    assert f"{listops.majority_accuracy('test'):.2%}" in rows[1] and rows[1].split("|")[-2].strip() == "30"
    cells = dict(zip([c.strip() for c in out.splitlines()[1].split("|")], [c.strip() for c in rows[1].split("|")], strict=True))
    correct = round(float(cells["accuracy"].rstrip("%")) / 100 * 30)
    assert float(cells["p_above_majority"]) == pytest.approx(binomial_tail(correct, 30, listops.majority_accuracy("test")), rel=1e-3)
    config = tokenmix.open_run(tmp_path / "r" / "model").model.config
    assert (config.pool, config.num_classes, config.vocab_size) == ("last", 10, 15)
    with pytest.raises(SystemExit, match="2"):
        main(["eval", str(tmp_path / "r"), "--lengths", "64"])
    assert "--lengths applies to language models" in capsys.readouterr().err


def test_final_evaluation_is_the_whole_split_or_a_sample_of_final_eval_tokens(tmp_path):
    common = dict(model="tnn", task="classify", data="listops:max_length=40:train=20:val=300:test=5", dim=8, depth=1, batch_size=4)
    common.update(steps=1, warmup=0, options={"rpe_dim": 4})
    whole = Trainer(TrainConfig(**common, out=str(tmp_path / "whole")), progress=False).run()
    sampled = Trainer(TrainConfig(**common, final_eval_tokens=1, out=str(tmp_path / "sampled")), progress=False).run()
    assert (whole["examples"], sampled["examples"]) == (300, Classification.MIN_EXAMPLES)


@pytest.mark.parametrize(("validation_examples", "evaluations"), [(200, 1), (300, 2)])
def test_the_final_validation_reuses_the_last_steps_when_both_read_the_same_examples(tmp_path, validation_examples, evaluations):
    """Periodic validation samples MIN_EXAMPLES (256) examples, the final one reads the split: a split of 200
    is read once at the last step, one of 300 twice; the final record holds what was read."""
    data = f"listops:max_length=40:train=20:val={validation_examples}:test=5"
    config = TrainConfig(model="tnn", task="classify", data=data, dim=8, depth=1, batch_size=4, steps=2, warmup=0, eval_every=2)
    trainer = Trainer(replace(config, eval_tokens=1, options={"rpe_dim": 4}, out=str(tmp_path)), progress=False)
    read, evaluate = [], trainer.objective.evaluate
    trainer.objective.evaluate = lambda *args, **options: read.append(options["max_tokens"]) or evaluate(*args, **options)
    final = trainer.run()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    periodic = next(r for r in records if r.get("split") == "val" and not r.get("final"))
    assert len(read) == evaluations and final["examples"] == validation_examples
    assert (final["loss"] == periodic["loss"]) == (evaluations == 1)


def test_retrieval_trains_the_dual_encoder_on_document_pairs(aan, tmp_path, capsys):
    folder, _ = aan
    out = train_and_evaluate(f"lra-retrieval:{folder}:max_length=64", tmp_path / "r", capsys)
    assert "val" in out and "test" in out
    assert tokenmix.open_run(tmp_path / "r" / "model").model.config.documents == 2


def test_pixel_tasks_give_their_grid_to_2d_mixers():
    data = load_data("shapes:size=6:train=8:val=4:test=4", 0)
    fields = objective_for(data, "classify").model_fields()
    assert fields["grid"] == (6, 6)
    config = TrainConfig(model="tnn2d", task="classify", data="shapes").model_config(fields)
    assert config.options["mixer"]["grid"] == [6, 6]
    assert "grid" not in TrainConfig(model="tnn", task="classify", data="shapes").model_config(fields).options["mixer"]
