import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import usage_error

from tokenmix.cli import main
from tokenmix.runs.checkpoint import load_checkpoint
from tokenmix.train import TrainConfig, Trainer


def tiny_config(text_file, out, **overrides):
    settings = dict(
        data=text_file,
        dim=16,
        depth=1,
        seq_len=32,
        batch_size=2,
        steps=6,
        eval_every=3,
        eval_tokens=256,
        out=str(out),
        options={"rpe_dim": 8},
        dropout=0.1,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def parameters(model):
    return {name: p.detach().clone() for name, p in model.state_dict().items()}


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe:300"])
def test_resume_equals_uninterrupted_run(text_file, tmp_path, monkeypatch, tokenizer):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    straight = Trainer(tiny_config(text_file, tmp_path / "a", tokenizer=tokenizer), progress=False)
    straight.run()
    interrupted = Trainer(tiny_config(text_file, tmp_path / "b", tokenizer=tokenizer), progress=False)
    for _ in range(3):
        interrupted.train_step()
    interrupted.save()
    interrupted.release_lock()  # killed here: the kernel drops its lock
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
    resumed = Trainer(tiny_config(text_file, tmp_path / "b", tokenizer=tokenizer), resume=True, progress=False)
    assert not (tmp_path / "cache" / "bpe").exists()  # the tokenizer came from the checkpoint, not learnt again
    assert resumed.tokenizer == straight.tokenizer and resumed.tokenizer.name.startswith(
        tokenizer[:4]
    )  # a BPE stops early when no pair is left
    assert resumed.step == 3
    resumed.run()
    expected, actual = parameters(straight.model), parameters(resumed.model)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    assert resumed.optimizer.state_dict()["state"].keys() == straight.optimizer.state_dict()["state"].keys()


def test_checkpoint_contents_and_atomic_write(text_file, tmp_path):
    trainer = Trainer(tiny_config(text_file, tmp_path / "run"), progress=False)
    trainer.run()
    files = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert files == ["checkpoint.pt", "metrics.jsonl", "model", "tokenizer.json"]
    state = load_checkpoint(tmp_path / "run")
    for key in ("model_config", "train_config", "model", "optimizer", "scheduler", "step", "rng"):
        assert key in state
    assert state["step"] == 6
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("split") == "val" and not r.get("final")] == [3, 6]


def test_resume_without_checkpoint_or_with_other_model_fails(text_file, tmp_path):
    with pytest.raises(ValueError, match="no checkpoint"):
        Trainer(tiny_config(text_file, tmp_path / "none"), resume=True, progress=False)
    Trainer(tiny_config(text_file, tmp_path / "c", steps=1), progress=False).run()
    with pytest.raises(ValueError, match="dim: checkpoint 16, given 24"):
        Trainer(tiny_config(text_file, tmp_path / "c", dim=24), resume=True, progress=False)


def test_time_budget_fixes_the_step_count(text_file, tmp_path):
    trainer = Trainer(tiny_config(text_file, tmp_path / "t", steps=None, minutes=0.02), progress=False)
    trainer.run()
    assert trainer.total_steps is not None and trainer.step == trainer.total_steps >= 5


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"task": "regression"}, "task"),
        ({"pool": "max"}, "pool"),
        ({"pool": "first"}, "pool shapes a classifier"),
        ({"recipe": "nope"}, "recipe must be one of"),
        ({"schedule": "step"}, "schedule"),
        ({"steps": None}, "exactly one"),
        ({"minutes": 1.0}, "exactly one"),
        ({"seq_len": 0}, "seq_len"),
    ],
)
def test_bad_train_config_raises(text_file, tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(text_file, tmp_path, **overrides)


def test_data_refuses_a_task_it_does_not_have(text_file, tmp_path):
    with pytest.raises(ValueError, match="language-modelling task: use --task lm or --task mlm"):
        Trainer(tiny_config(text_file, tmp_path / "run", task="classify"), progress=False)
    assert not (tmp_path / "run").exists()


def test_cli_train_eval_generate(text_file, tmp_path, capsys):
    out = tmp_path / "cli"
    common = [
        "--data",
        text_file,
        "--dim",
        "16",
        "--depth",
        "1",
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--eval-every",
        "2",
        "--eval-tokens",
        "128",
    ]
    assert main(["train", *common, "--steps", "3", "--out", str(out), "--sample-tokens", "8", "-o", "rpe_dim=8", "-o", "decay=1.0"]) == 0
    printed = capsys.readouterr().out
    assert "validation: loss" in printed and "sample:" in printed and "s/step" in printed
    assert load_checkpoint(out)["model_config"]["options"]["mixer"]["decay"] == 1.0
    report = tmp_path / "eval.json"
    assert main(["eval", str(out), "--lengths", "16,64", "--json", str(report)]) == 0
    results = json.loads(report.read_text())["results"]
    assert [r["length"] for r in results] == [16, 64] and all(r["bpb"] > 0 for r in results)
    assert "length" in capsys.readouterr().out
    assert main(["generate", str(out), "--prompt", "To be", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("To be")


def test_cli_reports_bad_paths_before_training(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):
        main(["eval", str(tmp_path / "nothing")])
    assert "does not exist" in capsys.readouterr().err


DDP_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from tokenmix.train import TrainConfig, Trainer
    config = TrainConfig(data=sys.argv[1], dim=8, depth=1, seq_len=16, batch_size=2, steps=4,
                         eval_every=2, eval_tokens=64, final_eval_tokens=64, out=sys.argv[2], options={"rpe_dim": 4},
                         save_every="0.001s")  # time-based saves: the ranks must agree on each one
    trainer = Trainer(config, progress=False)
    before = torch.cat([p.detach().flatten() for p in trainer.model.parameters()]).clone()
    trainer.run()
    flat = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    batches = [trainer.batch(0)[0] for _ in range(1)]
    seen = [torch.zeros_like(batches[0]) for _ in range(dist.get_world_size())]
    dist.all_gather(seen, batches[0])
    if dist.get_rank() == 0:
        assert dist.get_world_size() == 2
        assert torch.equal(gathered[0], gathered[1]), "ranks diverged"
        assert not torch.equal(flat, before), "no training happened"
        assert not torch.equal(seen[0], seen[1]), "ranks saw the same batch"
        print("RANKS IN SYNC")
    trainer.close()
    """
)


def test_auto_device_needs_a_gpu_per_process_and_cuda_says_so(monkeypatch):
    from tokenmix.devices import resolve_device
    from tokenmix.parallel.dims import init_distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto").type == "cuda"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: two processes on a one-GPU node
    assert resolve_device("auto").type == "cpu"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ValueError, match="one GPU per process"):
        init_distributed(torch.device("cuda"))


@pytest.mark.slow
def test_two_process_ddp_keeps_ranks_in_sync(text_file, tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        text_file,
        str(tmp_path / "ddp"),
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RANKS IN SYNC" in result.stdout
    assert load_checkpoint(tmp_path / "ddp")["step"] == 4


def test_masked_lm_training_and_evaluation(text_file, tmp_path, capsys):
    trainer = Trainer(tiny_config(text_file, tmp_path / "mlm", task="mlm", steps=3), progress=False)
    first = trainer.evaluate("val")
    final = trainer.run()
    assert trainer.model.config.vocab_size == 257 and not trainer.model.config.causal
    assert 0 < final["tokens"] < 0.25 * trainer.data.val.numel()  # only the masked ~15 % are scored
    assert final["loss"] < first["loss"]
    assert main(["eval", str(tmp_path / "mlm"), "--split", "val"]) == 0
    assert "tnn (mlm, " in capsys.readouterr().out


def test_time_budget_is_refixed_from_the_pace_of_the_whole_run(text_file, tmp_path, monkeypatch):
    """Slow first steps (caches filling) must not shorten a --minutes run: each validation re-fixes the step count."""
    original, calibrated = Trainer.train_step, []

    class Clock:  # the loop's clock: 50 ms per step for the first 5 steps, 10 ms after
        now = 0.0

        def perf_counter(self):
            return self.now

    clock = Clock()

    def timed_step(self):
        clock.now += 0.05 if self.step < 5 else 0.01
        return original(self)

    def first_calibration(self, seconds_per_step, calibrate=Trainer._calibrate):
        calibrate(self, seconds_per_step)
        calibrated.append(self.total_steps)

    monkeypatch.setattr("tokenmix.train.loop.time", clock)
    monkeypatch.setattr(Trainer, "train_step", timed_step)
    monkeypatch.setattr(Trainer, "_calibrate", first_calibration)
    trainer = Trainer(tiny_config(text_file, tmp_path / "t", steps=None, minutes=0.02, eval_every=10), progress=False)
    trainer.run()
    # budget 0.9 * 1.2 s: 21 steps at the first pace (50 ms); 5 slow steps then 83 fast ones at the run's own pace
    assert calibrated[0] == 21 and trainer.step == trainer.total_steps == calibrated[-1] > 80


@pytest.mark.parametrize(("source", "task", "kind"), [("listops", "lm", "classification"), ("assoc-recall", "mlm", "next-token")])
def test_a_task_the_data_cannot_learn_is_refused_before_the_data_is_read(tmp_path, monkeypatch, source, task, kind):
    def never(*args):
        raise AssertionError("the data was loaded before the task was checked")

    monkeypatch.setattr("tokenmix.train.setup.load_data", never)
    with pytest.raises(ValueError, match=f"is a {kind} task"):
        Trainer(TrainConfig(data=source, task=task, out=str(tmp_path / "run")), progress=False)


def test_warmup_at_or_past_the_last_step_is_refused_and_the_default_scales(text_file, tmp_path):
    with pytest.raises(ValueError, match=r"warmup \(10\) must be below steps \(10\)"):
        tiny_config(text_file, tmp_path / "w", steps=10, warmup=10)
    for steps, warmup in ((2, 0), (18, 2), (450, 50), (9000, 50)):  # 50 steps, or a ninth of a shorter run
        trainer = Trainer(tiny_config(text_file, tmp_path / f"d{steps}", steps=steps), progress=False)
        assert trainer.warmup_steps == warmup
    assert Trainer(tiny_config(text_file, tmp_path / "e", steps=18, warmup=5), progress=False).warmup_steps == 5


def test_threads_beyond_the_cpus_warn(text_file, tmp_path):
    from tokenmix.runtime import available_cpus

    with pytest.warns(UserWarning, match=f"--threads {available_cpus() + 1} exceeds the {available_cpus()} CPUs"):
        Trainer(tiny_config(text_file, tmp_path / "t", threads=available_cpus() + 1), progress=False)
    torch.set_num_threads(available_cpus())


def test_a_run_that_cannot_fit_is_refused_with_the_estimate(text_file, tmp_path, monkeypatch, capsys):
    """Fails if the estimate is not checked against the memory available before the run starts."""
    monkeypatch.setattr("tokenmix.train.memory.available_memory", lambda device: 1 << 20)
    command = ["train", "--data", text_file, "--dim", "16", "--depth", "1", "--seq-len", "32", "--steps", "1"]
    error = usage_error([*command, "--out", str(tmp_path / "refused")], capsys)
    assert "training needs about" in error and "more than the 0.00 GB available" in error and "lower --batch-size" in error
    assert not (tmp_path / "refused").exists()
    assert main([*command, "--out", str(tmp_path / "forced"), "--no-memory-check"]) == 0


def test_the_memory_estimate_is_the_saved_tensors_of_a_batch(text_file, tmp_path):
    """The two-point extrapolation (one example, two) gives what autograd saves for a whole batch. Fails if
    batch-independent tensors (kernels, spectra) are counted once per example, or the batch is ignored."""
    from tokenmix.train.memory import BACKWARD_MARGIN, saved_tensor_bytes

    trainer = Trainer(tiny_config(text_file, tmp_path / "m", batch_size=6), progress=False)
    inputs, targets, _ = trainer.objective.batch(6, trainer.config.seq_len, torch.Generator().manual_seed(0))
    exclude = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    saved = saved_tensor_bytes(lambda: trainer.objective.loss(trainer.model(inputs), targets), exclude)
    assert abs(trainer.memory.activations / BACKWARD_MARGIN - saved) <= 0.01 * saved
    weights = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    assert trainer.memory.parameters == 4 * weights


def test_the_memory_probe_takes_one_copy_when_two_would_not_fit(text_file, tmp_path, monkeypatch):
    """Where two copies of the largest example would not fit, the probe stops at one and counts every example
    in full (the upper bound). Fails if the second probe runs anyway or the bound is not used."""
    from tokenmix.train import memory

    fits = Trainer(tiny_config(text_file, tmp_path / "fits", batch_size=6), progress=False).memory
    probes = []
    original = memory.saved_tensor_bytes
    monkeypatch.setattr(memory, "saved_tensor_bytes", lambda run, exclude: probes.append(1) or original(run, exclude))
    monkeypatch.setattr(memory, "available_memory", lambda device: 1)
    tight = Trainer(tiny_config(text_file, tmp_path / "tight", batch_size=6), progress=False, memory_check=False).memory
    assert len(probes) == 1
    assert tight.parameters == fits.parameters and tight.activations > fits.activations


def test_the_peak_memory_a_run_reports_is_its_own_not_its_parents():
    """A process that grew to 400 MB and then exec'd ``tokenmix`` code: the peak that code reports is the new
    program's (under 300 MB), and ``reset_resident_peak`` lowers it to what is resident. Fails with ``ru_maxrss``,
    which Linux carries over the exec."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("the resident high-water mark is read from /proc (Linux)")
    report = (
        "import numpy, torch; from tokenmix.train.memory import peak_memory, reset_resident_peak, resident_peak; "
        "own = peak_memory(torch.device('cpu')); big = numpy.ones(50_000_000); del big; "
        "grown = resident_peak(); reset_resident_peak(); print(own, grown, resident_peak())"
    )
    grow_then_exec = (
        f"import os, sys, numpy; big = numpy.ones(50_000_000); big[:] = 2; os.execv(sys.executable, [sys.executable, '-c', {report!r}])"
    )
    own, grown, reset = map(
        int, subprocess.run([sys.executable, "-c", grow_then_exec], capture_output=True, text=True, check=True).stdout.split()
    )
    assert own < 300 << 20 and grown > own + (300 << 20) and reset < own + (100 << 20)
