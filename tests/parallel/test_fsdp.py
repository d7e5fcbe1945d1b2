"""FSDP2 (``--fsdp``), activation checkpointing and sharded checkpoints, under torchrun (gloo):
sharding changes where parameters live, not the steps taken."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from context_parallel_worker import small_options
from locations import TESTS

import tokenmix
from tokenmix.cli import main
from tokenmix.models.registry import list_models
from tokenmix.runs import open_run
from tokenmix.runs.checkpoint import load_checkpoint
from tokenmix.train.lock import LOCK_FILE

TRAIN = ["--dim", "16", "--depth", "2", "--seq-len", "64", "--batch-size", "2", "--eval-tokens", "1024", "--final-eval-tokens", "1024"]
# the default end-of-run sample (rank 0 alone: it once hung FSDP) kept, 16 tokens long instead of 300
TRAIN += ["--threads", "1", "--schedule", "inverse_sqrt", "--warmup", "2", "--sample-tokens", "16"]
SMALL_TNN = ["-o", "rpe_dim=8"]  # the default model, tnn, made faster
KILL_WORKER = TESTS / "fsdp_kill_worker.py"
CLI_WORKER = TESTS / "torchrun_cli_worker.py"
ENVIRONMENT = {**os.environ, "OMP_NUM_THREADS": "1"}


def launch(processes: int, *arguments: str) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node processes *arguments``."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    return subprocess.run([sys.executable, *launcher, *arguments], capture_output=True, text=True, timeout=600, env=ENVIRONMENT)


def run_cli(*arguments: str) -> tuple[int, str, str]:
    """``tokenmix *arguments`` in this process (what one process reads or trains needs no process of its
    own), on one thread as the launched processes are: (its exit status, stdout, stderr)."""
    stdout, stderr, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = main(list(arguments))
    finally:
        torch.set_num_threads(threads)
    return status, stdout.getvalue(), stderr.getvalue()


def arguments_of(out: Path, flags: tuple[str, ...]) -> list[str]:
    """``tokenmix train``'s arguments: ``TRAIN``, the small tnn unless ``flags`` name a model, then ``flags``."""
    return ["train", "--out", str(out), *TRAIN, *([] if "--model" in flags else SMALL_TNN), *flags]


def curve(out: Path, stdout: str) -> dict:
    """A finished run's {"steps": losses by step, "val": the final validation loss}; ``stdout``: rank 0's output."""
    assert "\nsample:\n" in stdout  # the default sample, printed by rank 0 alone (it once hung the job under FSDP)
    assert not (out / LOCK_FILE).exists()  # the job's lock went with it
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "steps": {record["step"]: record["loss"] for record in records if "split" not in record and "event" not in record},
        "val": [record["loss"] for record in records if record.get("final")][-1],
    }


def train(out: Path, *flags: str) -> dict:
    """``tokenmix train`` in this process (one process needs no launch of its own): its curve."""
    status, stdout, stderr = run_cli(*arguments_of(out, flags))
    assert status == 0, stdout[-3000:] + stderr[-3000:]
    return curve(out, stdout)


def train_under_torchrun(processes: int, runs: dict[Path, tuple[str, ...]]) -> dict[Path, dict]:
    """``tokenmix train`` of each run folder with its flags, one after the other, in one torchrun launch of
    ``processes`` processes (``torchrun_cli_worker.py``): the curve of each."""
    commands = [{"argv": arguments_of(out, flags), "log": str(out) + ".log"} for out, flags in runs.items()]
    listing = next(iter(runs)).parent / f"commands-{processes}.json"
    listing.write_text(json.dumps(commands))
    result = launch(processes, str(CLI_WORKER), str(listing))
    logs = {out: [Path(f"{out}.log.rank{rank}") for rank in range(processes)] for out in runs}
    assert result.returncode == 0, result.stderr[-3000:] + "".join(
        log.read_text()[-2000:] for paths in logs.values() for log in paths if log.exists()
    )
    return {out: curve(out, logs[out][0].read_text()) for out in runs}


def assert_same_curve(got: dict, want: dict, tolerance: float) -> None:
    assert got["steps"].keys() == want["steps"].keys()
    for step, loss in want["steps"].items():
        assert abs(got["steps"][step] - loss) <= tolerance * abs(loss), (step, got["steps"][step], loss)
    assert abs(got["val"] - want["val"]) <= tolerance * abs(want["val"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The curves of the torchrun runs, two launches for all (4 processes, then 2), in folders under "root":
    6 steps of tnn with the default flags but sizes: DDP, context parallelism, and FSDP (with activation
    checkpointing) on 2 processes, FSDP on dp 2 x cp 2; Transformer-XL on DDP and FSDP, tnn in bf16 on DDP
    and FSDP; 3 steps of FSDP over 4 processes splitting each sequence in 4 ("four"), resumed to step 6 by 2
    splitting it in 2 ("resumed_2")."""
    root = tmp_path_factory.mktemp("fsdp")
    steps = ("--steps", "6", "--eval-every", "6", "--save-every", "3")
    xl = ("--model", "transformer_xl", "--seq-len", "32", "--steps", "4", "--eval-every", "4", "--save-every", "2")
    bf16 = ("--steps", "4", "--eval-every", "4", "--precision", "bf16")
    four = {
        "fsdp_2d": (*steps, "--fsdp", "--context-parallel", "2"),
        "four": ("--steps", "3", "--eval-every", "3", "--fsdp", "--context-parallel", "4"),
    }
    curves = train_under_torchrun(4, {root / name: flags for name, flags in four.items()})
    shutil.copytree(root / "four", root / "resumed_2")
    two = {
        "ddp": steps,
        "cp": (*steps, "--context-parallel", "2"),
        "fsdp": (*steps, "--fsdp", "--activation-checkpointing"),
        "xl_ddp": xl,
        "xl_fsdp": (*xl, "--fsdp", "--activation-checkpointing"),
        "bf16_ddp": bf16,
        "bf16_fsdp": (*bf16, "--fsdp"),
        "resumed_2": ("--resume", "--steps", "6", "--context-parallel", "2"),
    }
    curves |= train_under_torchrun(2, {root / name: flags for name, flags in two.items()})
    return {out.name: curve for out, curve in curves.items()} | {"root": root}


@pytest.mark.slow
def test_fsdp_takes_the_steps_of_ddp(runs):
    """The same loss at each of 6 steps and the same validation loss: sharding is exact (float32 reductions in another order)."""
    assert len(runs["fsdp"]["steps"]) == 6
    assert_same_curve(runs["fsdp"], runs["ddp"], 1e-5)


@pytest.mark.slow
def test_fsdp_trains_a_segment_recurrent_model_as_ddp_does(runs):
    """Transformer-XL trains by ``step`` with its memory carried: FSDP gathers a block's weights for it too."""
    assert_same_curve(runs["xl_fsdp"], runs["xl_ddp"], 1e-5)


@pytest.mark.slow
def test_fsdp_in_bf16_gathers_half_weights_and_takes_the_steps_of_ddp_in_bf16(runs):
    """FSDP2's mixed-precision policy (weights gathered in bf16, but the layer norms' and the TNO's, which
    compute in float32) against DDP under autocast, whose products see the same bf16 weights: the same curve
    to the norms' weights rounding."""
    assert_same_curve(runs["bf16_fsdp"], runs["bf16_ddp"], 1e-3)
    assert load_checkpoint(runs["root"] / "bf16_fsdp" / "checkpoint.pt")["train_config"]["precision"] == "bf16"


@pytest.mark.slow
def test_eval_and_generate_read_what_every_torchrun_layout_wrote(runs):
    """``eval`` and ``generate`` of each run's directory (DDP, context parallel, FSDP, dp x cp), in one process,
    flags but sizes left to their defaults: one ``eval`` of all four (its first 2048 tokens) gives a row for
    each, and ``generate`` of each continues its default prompt."""
    folders = [str(runs["root"] / run) for run in ("ddp", "cp", "fsdp", "fsdp_2d")]
    status, stdout, stderr = run_cli("eval", *folders, "--max-tokens", "2048")
    assert status == 0 and " bpb " in stdout, stdout[-2000:] + stderr[-2000:]
    rows = [line.split("|")[1].strip() for line in stdout.splitlines() if line.startswith("|") and " test " in line]
    assert rows == folders, stdout  # a row each: the table's first column names the run
    for folder in folders:
        status, stdout, stderr = run_cli("generate", folder, "--max-new-tokens", "16")
        assert status == 0 and stdout.startswith("ROMEO."), stdout[-2000:] + stderr[-2000:]


@pytest.mark.slow
def test_fsdp_over_data_and_context_parallel_processes_equals_data_parallel_alone(runs):
    """dp 2 x cp 2 = 4 processes read the batches of dp 2 and split each sequence in two: the same steps."""
    assert_same_curve(runs["fsdp_2d"], runs["ddp"], 1e-5)


@pytest.mark.slow
def test_a_sharded_run_is_read_in_one_process(runs, tmp_path):
    """The checkpoint of a --fsdp run names its shard folder; eval, generate and export-hf read the whole
    model from it in one process, and it is the model the run wrote at its end."""
    run = runs["root"] / "fsdp"
    state = load_checkpoint(run)
    assert state["shards"] == "shards/step-00000006" and state["model"] == {}
    assert sorted(path.name for path in (run / "shards").iterdir()) == ["step-00000006"]  # step 3's went once step 6's was kept
    assert len(list((run / "shards" / "step-00000006").glob("*.safetensors"))) == 2  # one file per process
    model = open_run(run).model
    final = tokenmix.open_run(run / "model").model
    for (name, weight), (other, whole) in zip(model.state_dict().items(), final.state_dict().items(), strict=True):
        assert name == other and torch.equal(weight, whole), name
    reads = [["eval", str(run), "--max-tokens", "2048"], ["generate", str(run), "--prompt", "To be", "--max-new-tokens", "8"]]
    reads.append(["export-hf", str(run), str(tmp_path / "hf")])
    for command in reads:
        status, stdout, stderr = run_cli(*command)
        assert status == 0, stdout[-2000:] + stderr[-2000:]


@pytest.mark.slow
def test_a_run_sharded_over_four_processes_continues_exactly_on_two_and_on_one(runs, tmp_path):
    """Saved by 4 processes (FSDP, each sequence split in 4) at step 3, resumed by 2 (FSDP, split in 2)
    and by 1 (neither): steps 4 to 6 and the validation are those of one process that never stopped."""
    alone = train(tmp_path / "alone", "--steps", "6", "--eval-every", "6")
    assert_same_curve(runs["resumed_2"], alone, 1e-5)
    assert load_checkpoint(runs["root"] / "resumed_2").get("shards") == "shards/step-00000006"
    shutil.copytree(runs["root"] / "four", tmp_path / "resumed_1")
    assert_same_curve(train(tmp_path / "resumed_1", "--resume", "--steps", "6", "--context-parallel", "1", "--no-fsdp"), alone, 1e-5)
    assert load_checkpoint(tmp_path / "resumed_1").get("shards") is None


@pytest.mark.slow
def test_a_save_killed_midway_keeps_the_previous_checkpoint(tmp_path):
    """Process 0 killed after step 4's shards are written, before checkpoint.pt names them: the run
    resumes from step 2 (the unfinished folder removed), in one process."""
    run = tmp_path / "run"
    result = launch(2, str(KILL_WORKER), str(run))
    assert result.returncode != 0
    assert load_checkpoint(run)["step"] == 2 and (run / "shards" / "step-00000004").is_dir()
    status, stdout, stderr = run_cli("train", "--resume", "--out", str(run), "--no-fsdp", "--steps", "3", "--sample-tokens", "16")
    assert status == 0, stdout[-2000:] + stderr[-2000:]
    assert "removed" in stdout + stderr and not (run / "shards").exists()
    assert load_checkpoint(run)["step"] == 3


def test_fsdp_without_torchrun_says_how_to_start_it(tmp_path):
    from tokenmix.train.config import TrainConfig
    from tokenmix.train.loop import Trainer

    with pytest.raises(ValueError, match=r"--fsdp shards the model over torchrun processes: start them with torchrun"):
        Trainer(TrainConfig(dim=16, depth=1, seq_len=32, steps=1, out=str(tmp_path / "run"), fsdp=True), progress=False)
    assert not (tmp_path / "run").exists()


def test_a_whole_checkpoint_does_not_resume_sharded(tmp_path, monkeypatch):
    """--resume --fsdp needs a sharded checkpoint: a whole one says to resume without --fsdp."""
    from tokenmix.train.config import TrainConfig
    from tokenmix.train.loop import Trainer

    config = TrainConfig(dim=16, depth=1, seq_len=32, steps=1, eval_tokens=64, final_eval_tokens=64, out=str(tmp_path / "run"))
    Trainer(config, progress=False).run()
    monkeypatch.setattr("tokenmix.train.setup.check_launch", lambda *_: None)  # as if under torchrun: the refusal comes first
    with pytest.raises(ValueError, match=r"--resume --fsdp reads sharded checkpoints; .* resume it without --fsdp"):
        Trainer(TrainConfig(**{**config.__dict__, "steps": 2, "fsdp": True}), resume=True, progress=False)


@pytest.mark.parametrize("name", list_models())
def test_activation_checkpointing_recomputes_the_same_gradients(name):
    """Every model: with its blocks' activations recomputed in the backward pass, the loss and every
    gradient are those of the plain backward pass (dropout included: the recomputation replays its RNG)."""
    spec = tokenmix.models.registry.model_spec(name)
    task = "lm" if "lm" in spec.tasks else spec.tasks[0]
    torch.manual_seed(0)
    classes = {"num_classes": 3} if task == "classify" else {}
    model = tokenmix.build_model(name, task=task, vocab_size=20, dim=8, depth=2, dropout=0.1, **classes, **small_options(name))
    tokens = torch.randint(0, 20, (2, 19))

    calls, block = [], model.blocks[0]
    block.register_forward_pre_hook(lambda *_: calls.append(1))
    step = block.step
    block.step = lambda *inputs: (calls.append(1), step(*inputs))[1]  # how segment-recurrent models train

    def gradients(checkpointing: bool) -> dict:
        model.activation_checkpointing = checkpointing
        model.zero_grad()
        calls.clear()
        torch.manual_seed(1)
        logits = model(tokens, state=model.init_state(2), return_state=True)[0] if model.recurrent else model(tokens)
        logits.float().square().mean().backward()
        assert len(calls) == (2 if checkpointing else 1)  # recomputed in the backward pass
        return {key: parameter.grad.clone() for key, parameter in model.named_parameters() if parameter.grad is not None}

    plain, recomputed = gradients(False), gradients(True)
    assert plain.keys() == recomputed.keys() and plain
    for key in plain:
        assert torch.allclose(recomputed[key], plain[key], rtol=1e-5, atol=1e-7), key
