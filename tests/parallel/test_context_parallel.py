"""Context parallelism (``tokenmix.parallel``): every model, its sequences split over 2 and 4 torchrun
processes (gloo; one launch of 4), against the same model in one process (``context_parallel_worker.py``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from context_parallel_worker import VARIANTS, tasks_of  # VARIANTS: models with another mixer (bidirectional FNet)
from locations import TESTS

import tokenmix
from tokenmix.cli import main
from tokenmix.models.config import POOLS
from tokenmix.models.model import pool_hidden, pooling_weights
from tokenmix.models.registry import model_spec
from tokenmix.parallel import ContextShard, context_parallel_logits, context_parallel_problems, shard_bounds

WORKER = TESTS / "context_parallel_worker.py"
CLI_WORKER = TESTS / "torchrun_cli_worker.py"
TOLERANCE = {"torch.float64": 1e-10, "torch.float32": 1e-5}  # relative, the bar for "the same numbers"


@pytest.fixture(scope="module")
def worker_records(tmp_path_factory) -> dict[str, list[dict]]:
    """The worker's records by number of processes ("4", "2"), from one torchrun of 4 processes."""
    output = tmp_path_factory.mktemp("context_parallel") / "records.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(WORKER), str(output)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(output.read_text())


@pytest.fixture(scope="module", params=[2, 4], ids=lambda processes: f"{processes}_processes")
def split_runs(request, worker_records) -> dict:
    """The worker's records by model, split over ``processes`` processes."""
    by_model = {}
    for record in worker_records[str(request.param)]:
        by_model.setdefault(record["model"], []).append(record)
    return by_model


@pytest.mark.slow
@pytest.mark.parametrize("name", [*tokenmix.list_models(), *VARIANTS])
def test_a_split_sequence_gives_the_numbers_of_one_process(split_runs, name):
    """Logits (classification: pooled over the shards), loss and every parameter's gradient (summed over
    the processes) equal one process's, at a length neither 2 nor 4 divides, with padding on both sides;
    the logits of every shard but the last stay put when the last shard's tokens change (causal models);
    segment-recurrent models continue a stream: the second segment's logits and gradients and every
    layer's memory after it. A model that cannot split says why."""
    records = split_runs[name]
    assert {record["task"] for record in records} == set(tasks_of(name))
    for record in records:
        if "problems" in record:
            assert record["problems"] and all(problem.startswith(f"model {name!r}: ") for problem in record["problems"])
            continue
        tolerance = TOLERANCE[record["dtype"]]
        assert max(record["logits"], record["loss"], record["gradients"]) < tolerance, record
        if "stream_logits" in record:  # Transformer-XL: a second segment over the first's memory
            assert max(record["stream_logits"], record["stream_gradients"], record["stream_memory"]) < tolerance, record
            assert record["stream_memory_length"] == 30, record  # memory_length: the second segment's end, then the first's
        if record["task"] == "lm" and record["dtype"] == "torch.float64":
            assert record["earlier_shards_moved"] < 1e-12, record


SPLIT_MODELS = ["tnn", "fd_tnn", "ski_tnn", "tnn2d", "mega", "tcnca", "tcnca_simple", "transformer", "transformer_xl", "fnet_ar_xl"]


@pytest.mark.parametrize("name", SPLIT_MODELS)
def test_the_papers_models_split(name):
    """The models of the four papers and their baselines split over 4 processes."""
    model = tokenmix.build_model(name, task=model_spec(name).tasks[0], vocab_size=20, dim=16, depth=1)
    assert context_parallel_problems(model, 4) == []


def test_shards_are_contiguous_and_balanced():
    for length in (1, 7, 23, 100):
        for parts in (1, 2, 4):
            bounds = shard_bounds(length, parts)
            assert bounds[0][0] == 0 and bounds[-1][1] == length
            assert all(stop == next_start for (_, stop), (next_start, _) in zip(bounds, bounds[1:], strict=False))
            sizes = [stop - start for start, stop in bounds]
            assert max(sizes) - min(sizes) <= 1


def test_what_cannot_split_says_why_before_any_work():
    separable = tokenmix.build_model("tnn", task="mlm", mixer="separable2d", vocab_size=20, dim=16, depth=1)
    (problem,) = context_parallel_problems(separable, 2)
    assert problem.startswith("model 'tnn': Separable2d cannot split a sequence over processes")
    one_head = tokenmix.build_model("transformer", vocab_size=20, dim=16, depth=1, heads=1)
    assert context_parallel_problems(one_head, 2) == []  # ring attention
    dual_encoder = tokenmix.build_model("tnn", task="classify", num_classes=3, documents=2, vocab_size=20, dim=16, depth=1)
    assert context_parallel_problems(dual_encoder, 2) == []  # pooling adds the shards' sums


@pytest.mark.parametrize("how", POOLS)
def test_pooled_summaries_add_up_over_the_shards(how):
    """A split classifier pools by adding each shard's weighted sum of its hidden states (``ContextRun.pool``):
    for every pooling, with padding on either side, the sums over 4 shards give ``pool_hidden`` of the whole."""
    h = torch.randn(2, 23, 4, dtype=torch.float64)
    mask = torch.ones(2, 23, dtype=torch.bool)
    mask[0, :3], mask[1, -6:] = False, False
    weights = pooling_weights(mask, (2, 23), how, torch.float64)
    parts = [torch.einsum("bn,bnd->bd", weights[:, start:stop], h[:, start:stop]) for start, stop in shard_bounds(23, 4)]
    torch.testing.assert_close(torch.stack(parts).sum(0), pool_hidden(h, mask, how), rtol=1e-13, atol=1e-13)


def test_a_sequence_shorter_than_the_group_is_refused():
    model = tokenmix.build_model("tnn", vocab_size=20, dim=16, depth=1)
    with pytest.raises(ValueError, match="sequences of 3 tokens cannot be split over 4 processes"):
        context_parallel_logits(model, torch.zeros(1, 3, dtype=torch.long), None, ContextShard(None, 0, 4, 3))


def test_tokens_and_masks_of_the_wrong_length_for_the_shard_are_refused():
    """Whole sequences, or the shard's tokens alone (``tokens_given_whole=False``) with the mask of whole ones."""
    model, shard = tokenmix.build_model("tnn", vocab_size=20, dim=16, depth=1), ContextShard(None, 1, 4, 23)  # [6, 12)
    tokens = torch.zeros(2, 23, dtype=torch.long)
    with pytest.raises(ValueError, match="tokens have length 22, but the shard was made for sequences of 23"):
        context_parallel_logits(model, tokens[:, 1:], None, shard)
    with pytest.raises(ValueError, match="tokens have length 23, but the shard was made for process 1's 6 of sequences of 23"):
        context_parallel_logits(model, tokens, None, shard, tokens_given_whole=False)
    with pytest.raises(ValueError, match=r"mask must have shape \(batch, length\) = \(2, 23\), got \(2, 6\)"):
        context_parallel_logits(model, tokens[:, 6:12], torch.ones(2, 6, dtype=torch.bool), shard, tokens_given_whole=False)


TRAIN = ["--dim", "16", "--depth", "2", "--seq-len", "97", "--batch-size", "2", "--steps", "6", "--eval-every", "6"]
# the default end-of-run sample kept, 16 tokens long instead of 300
TRAIN += ["--eval-tokens", "1024", "--final-eval-tokens", "1024", "--threads", "1", "--save-every", "6", "--sample-tokens", "16"]
SMALL_OPTIONS = {"tnn": ["-o", "rpe_dim=8"], "fd_tnn": ["-o", "rpe_dim=8"], "tcnca": ["-o", "chunk_size=16", "-o", "z_dim=8"]}
TRAINED = ["tnn", "fd_tnn", "ski_tnn", "tcnca", "transformer", "transformer_xl"]
LISTOPS = ["--data", "listops:max_length=120:train=64:val=32:test=8", "--task", "classify", "--batch-size", "4"]


def train_arguments(out: Path, model: str, *flags: str) -> list[str]:
    return ["train", "--model", model, "--out", str(out), *TRAIN, *flags, *SMALL_OPTIONS.get(model, [])]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train(out: Path, model: str, *flags: str) -> list[dict]:
    """``tokenmix train`` in this process (one process needs no launch of its own): the run's metrics records."""
    stdout, stderr, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = main(train_arguments(out, model, *flags))
    finally:
        torch.set_num_threads(threads)  # --threads 1 set it for this run alone
    assert status == 0, stdout.getvalue()[-3000:] + stderr.getvalue()[-3000:]
    return metrics(out)


BAD_RUNS = {  # settings refused under torchrun --nproc-per-node 2: (flags, the message)
    "too_many": (["--context-parallel", "4"], "--context-parallel 4 must divide the 2 processes torchrun started"),
    "separable": (
        ["--task", "mlm", "-o", "mixer=separable2d", "--context-parallel", "2"],
        "Separable2d cannot split a sequence over processes",
    ),
}


@pytest.fixture(scope="module")
def split_trainings(tmp_path_factory) -> dict[str, list[dict]]:
    """One launch of ``torchrun --nproc-per-node 2`` (``torchrun_cli_worker.py``) runs, one after the other,
    ``train`` of each of ``BAD_RUNS``, which must be refused (its output in "<root>/<name>.rank<R>"), then
    ``train --context-parallel 2`` of each model in ``TRAINED`` and of ListOps classification ("classify"):
    the metrics records of each run, and "root"."""
    root = tmp_path_factory.mktemp("split_trainings")
    refused = ["--steps", "1", "--dim", "16", "--depth", "1", "--seq-len", "32"]
    commands = [
        {"argv": ["train", "--out", str(root / name), *refused, *flags], "log": str(root / name), "refused": True}
        for name, (flags, _) in BAD_RUNS.items()
    ]
    within = ["--data", f"{within_documents(root / 'prepared')}:windows=within"]
    runs = {name: (name,) for name in TRAINED} | {"classify": ("tnn", *LISTOPS), "within": ("tnn", *within)}
    commands += [
        {"argv": train_arguments(root / run, *flags, "--context-parallel", "2"), "log": str(root / run)} for run, flags in runs.items()
    ]
    listing = root / "commands.json"
    listing.write_text(json.dumps(commands))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(CLI_WORKER), str(listing)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    logs = "".join(path.read_text()[-2000:] for path in sorted(root.glob("*.rank*")))
    assert result.returncode == 0, result.stderr[-3000:] + logs
    return {run: metrics(root / run) for run in runs} | {"root": root, "flags": runs}


def within_documents(out: Path) -> Path:
    """A corpus prepared as bytes, of documents from 20 to 300 bytes: read by windows within documents, many padded."""
    text = out.with_suffix(".txt")
    words = ["to", "be", "or", "not", "that", "is", "the", "question"]
    text.write_text("\n\n".join(" ".join(words[(3 * n + k) % 8] for k in range(5 + n % 60)) for n in range(400)))
    assert main(["prepare", str(text), "--tokenizer", "bytes", "--out", str(out), "--text-unit", "paragraph"]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_training_with_the_sequence_split_over_two_processes_follows_one_process(name, split_trainings, tmp_path):
    """``torchrun --nproc-per-node 2 ... train --context-parallel 2`` reads the batches of one process and
    takes the same steps: every step's loss and the validation loss after 6 steps agree within 1e-4
    (Transformer-XL: one stream of segments, its memory carried from step to step)."""
    alone = train(tmp_path / "one", name)
    split = split_trainings[name]
    losses = [[record["loss"] for record in run if "split" not in record] for run in (alone, split)]
    assert len(losses[0]) == len(losses[1]) == 6
    assert max(abs(a - b) / abs(a) for a, b in zip(*losses, strict=True)) < 1e-4
    final = [run[-1]["loss"] for run in (alone, split)]
    assert abs(final[0] - final[1]) / final[0] < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("run", ["classify", "within"])
def test_classification_and_padded_windows_with_the_sequence_split_follow_one_process(run, split_trainings, tmp_path):
    """ListOps classification split over two processes (the pooled summary adds the shards' sums, every process
    holds the class logits), and windows within the documents of a prepared corpus (each process reads its part
    of every window and the padding mask of whole ones; the count of scored tokens is the group's): the 6 steps
    and the validation loss are those of one process."""
    alone = train(tmp_path / "one", *split_trainings["flags"][run])
    split = split_trainings[run]
    losses = [[record["loss"] for record in records if "split" not in record] for records in (alone, split)]
    assert len(losses[0]) == 6 and max(abs(a - b) / abs(a) for a, b in zip(*losses, strict=True)) < 1e-4
    assert abs(alone[-1]["loss"] - split[-1]["loss"]) / alone[-1]["loss"] < 1e-4


def test_context_parallel_without_torchrun_says_how_to_start_it(tmp_path):
    from tokenmix.train.config import TrainConfig
    from tokenmix.train.loop import Trainer

    config = TrainConfig(dim=16, depth=1, seq_len=32, steps=1, out=str(tmp_path / "run"), context_parallel=2)
    with pytest.raises(ValueError, match=r"--context-parallel 2 splits each sequence over torchrun processes: start them with torchrun"):
        Trainer(config, progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"seq_len": 3, "context_parallel": 4}, "seq_len=3 gives fewer tokens than the 4 processes"),
    ],
)
def test_bad_context_parallel_settings_are_refused(settings, message):
    from tokenmix.train.config import TrainConfig

    with pytest.raises(ValueError, match=message):
        TrainConfig(**{"context_parallel": 2, **settings})


@pytest.mark.slow
@pytest.mark.parametrize("name", BAD_RUNS)
def test_bad_context_parallel_runs_stop_before_any_work(name, split_trainings):
    """Under torchrun, ``train`` with these settings fails (in the launch of ``split_trainings``, whose worker
    checks its exit status) on every process, saying why, and leaves no run directory; the processes go on
    to the next command."""
    root = split_trainings["root"]
    for rank in (0, 1):
        assert BAD_RUNS[name][1] in (root / f"{name}.rank{rank}").read_text()
    assert not (root / name).exists()


@pytest.mark.slow
def test_the_scale_bench_measures_what_a_split_saves(tmp_path):
    """``tokenmix bench --kinds scale`` under torchrun: per process, a split sequence keeps fewer activations
    and fits a longer sequence in the same budget; exchanges send bytes only when split; JSON, table and plot."""
    from tokenmix.bench.run import bench_tables

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "tokenmix.cli", "bench"]
    command += ["--kinds", "scale", "--models", "tnn,tcnca", "--lengths", "256,512", "--model-dim", "16", "--depth", "1"]
    command += ["--processes", "1,2", "--repeats", "1", "--threads", "1", "--memory-budget", "0.004"]
    command += ["--output", str(tmp_path / "scale.json"), "--plot", str(tmp_path / "plots")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = json.loads((tmp_path / "scale.json").read_text())
    assert bench_tables(records) in result.stdout
    assert (tmp_path / "plots" / "scale.png").stat().st_size > 0
    steps = {(r["model"], r["processes"], r["length"]): r for r in records if r["kind"] == "scale"}
    assert len(steps) == 2 * 2 * 2
    for (model, processes, length), record in steps.items():
        if processes == 2:
            alone = steps[(model, 1, length)]
            assert record["activation_bytes"] < alone["activation_bytes"]
            assert record["exchanged_bytes"] > 0 and 0 < record["communication_share"] < 1
        else:
            assert record["exchanged_bytes"] == 0
    limits = {(r["model"], r["processes"]): r for r in records if r["kind"] == "scale_limit"}
    for model in ("tnn", "tcnca"):
        assert limits[(model, 2)]["longest_length"] > limits[(model, 1)]["longest_length"] > 0
        assert all(limits[(model, count)]["activation_bytes"] <= limits[(model, count)]["budget_bytes"] for count in (1, 2))
