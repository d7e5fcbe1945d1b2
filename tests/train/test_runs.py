"""Nothing a user trained is lost or silently replaced: run directories, resumes, signals, divergence."""

import json
import os
import shutil
import signal
import threading
import time

import pytest
import torch
from conftest import INTERPRETED_TRITON, usage_error

from tokenmix.cli import main
from tokenmix.cli import train as train_command
from tokenmix.generation import generate
from tokenmix.ops import fused_toeplitz
from tokenmix.ops.fused_toeplitz import kernel_choice
from tokenmix.runs.checkpoint import load_checkpoint
from tokenmix.runs.metrics import read_metrics
from tokenmix.train import TrainConfig, Trainer
from tokenmix.train.config import parse_interval
from tokenmix.train.stopping import TrainingDiverged


def tiny(text_file, out, **overrides) -> TrainConfig:
    settings = dict(data=text_file, dim=8, depth=1, seq_len=16, batch_size=2, steps=6, eval_every=100, eval_tokens=64)
    return TrainConfig(**{**settings, "out": str(out), "options": {"rpe_dim": 4}, **overrides})


def cli_train(text_file, out, *extra) -> list[str]:
    sizes = ["--data", text_file, "--dim", "8", "--depth", "1", "--seq-len", "16", "--batch-size", "2"]
    quiet = ["--eval-every", "100", "--eval-tokens", "64", "--sample-tokens", "16"]
    return ["train", *sizes, *quiet, "-o", "rpe_dim=4", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    """(corpus, a pristine copy of a finished 3-step CLI run, the path the run was trained at): trained once."""
    root = tmp_path_factory.mktemp("three_steps")
    corpus = root / "corpus.txt"
    corpus.write_bytes(("To be, or not to be, that is the question. " * 200).encode())
    assert main(cli_train(str(corpus), root / "run", "--steps", "3")) == 0
    shutil.copytree(root / "run", root / "pristine")
    return corpus, root / "pristine", root / "run"


@pytest.fixture
def finished_run(three_steps):
    """(corpus, run): the finished 3-step run, restored where it was trained (a resume records a moved run's
    new place as a change), so each test may resume or overwrite it."""
    corpus, pristine, run = three_steps
    shutil.rmtree(run)
    shutil.copytree(pristine, run)
    return str(corpus), run


def weights(run) -> dict:
    return load_checkpoint(run)["model"]


def steps_logged(run) -> list[int]:
    return [record["step"] for record in read_metrics(run / "metrics.jsonl") if "loss" in record and "split" not in record]


def test_a_run_directory_is_never_silently_reused(finished_run, capsys):
    text_file, run = finished_run
    before = (run / "checkpoint.pt").read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        main(cli_train(text_file, run, "--steps", "3"))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "already holds a run" in error and "--resume" in error and "--overwrite" in error
    assert (run / "checkpoint.pt").read_bytes() == before
    assert main(cli_train(text_file, run, "--steps", "4", "--overwrite")) == 0
    records = read_metrics(run / "metrics.jsonl")
    assert steps_logged(run) == [1, 2, 3, 4] and sum(bool(r.get("final")) for r in records) == 1


@INTERPRETED_TRITON
def test_a_run_steps_on_the_kernels_it_asks_for_and_a_resume_may_change_them(finished_run, capsys, monkeypatch):
    """``--kernels fused`` (on the CPU, in Triton's interpreter: conftest.py): the factored products of the memory
    estimate (two forwards, of one and two copies of a batch) and of the step (forward and backward) by the fused kernel,
    the end-of-run sample generated under the choice too; a resume records the change; a resume of a run set to fused
    where the kernels cannot run is refused in one line that says how to change it, the run untouched."""
    _, run = finished_run
    assert load_checkpoint(run)["train_config"]["kernels"] == "auto"
    launches, launch = [], fused_toeplitz._launch
    monkeypatch.setattr(fused_toeplitz, "_launch", lambda *args, **kwargs: launches.append(kwargs) or launch(*args, **kwargs))
    sampled = []
    monkeypatch.setattr(train_command, "generate", lambda *args, **kwargs: sampled.append(kernel_choice()) or generate(*args, **kwargs))
    assert main(["train", "--resume", "--out", str(run), "--steps", "4", "--kernels", "fused"]) == 0
    assert [bool(kwargs.get("conjugate")) for kwargs in launches] == [False, False, False, True] and sampled == ["fused"]
    assert load_checkpoint(run)["resumes"] == [{"step": 3, "changed": {"steps": [3, 4], "kernels": ["auto", "fused"]}}]
    monkeypatch.delenv("TRITON_INTERPRET")
    before = (run / "checkpoint.pt").read_bytes()
    error = usage_error(["train", "--resume", "--out", str(run), "--steps", "5"], capsys)
    assert "kernels 'fused' (--kernels; a resume keeps the run's own unless --kernels gives another)" in error
    assert "the fused kernels run on CUDA tensors (or any under TRITON_INTERPRET=1), got cpu" in error
    assert (run / "checkpoint.pt").read_bytes() == before


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--lr", "0.01"], ["lr: checkpoint 0.003, given 0.01"]),
        (["--seq-len", "24", "--batch-size", "3"], ["seq_len: checkpoint 16, given 24", "batch_size: checkpoint 2, given 3"]),
        (["--schedule", "constant"], ["schedule: checkpoint 'cosine', given 'constant'"]),
        (["--data", "shakespeare"], ["data: checkpoint"]),
        (["--steps", "2"], ["ends before the checkpoint's step 3"]),
        ([], ["already finished at step 3"]),
    ],
)
def test_resume_refuses_changes_that_break_the_run(finished_run, capsys, flags, named):
    _, run = finished_run
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--resume", "--out", str(run), *flags])
    error = capsys.readouterr().err
    assert all(text in error for text in named), error


def test_resume_options_are_compared_by_the_model_they_build(finished_run, capsys):
    _, run = finished_run
    assert main(["train", "--resume", "--out", str(run), "--steps", "4", "-o", "decay=0.99"]) == 0  # the default
    assert load_checkpoint(run)["train_config"]["options"] == {"rpe_dim": 4}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--resume", "--out", str(run), "--steps", "5", "-o", "decay=0.9"])
    assert "options: checkpoint {'rpe_dim': 4}, given {'rpe_dim': 4, 'decay': 0.9}" in capsys.readouterr().err


def test_more_steps_are_allowed_and_recorded_truthfully(finished_run):
    _, run = finished_run
    assert main(["train", "--resume", "--out", str(run), "--steps", "5"]) == 0  # other settings from the checkpoint
    state = load_checkpoint(run)
    assert state["step"] == 5 and state["train_config"]["steps"] == 5 and state["train_config"]["seq_len"] == 16
    assert state["resumes"] == [{"step": 3, "changed": {"steps": [3, 5]}}]
    records = read_metrics(run / "metrics.jsonl")
    assert {"step": 3, "event": "resume", "changed": {"steps": [3, 5]}} in records
    assert steps_logged(run) == [1, 2, 3, 4, 5] and sum(bool(r.get("final")) for r in records) == 1


def test_resume_after_a_kill_logs_each_step_once_and_removes_stale_temporaries(text_file, tmp_path):
    straight = Trainer(tiny(text_file, tmp_path / "a"), progress=False)
    straight.run()
    interrupted = Trainer(tiny(text_file, tmp_path / "b"), progress=False)
    for _ in range(3):
        interrupted.log({"step": interrupted.step + 1, "loss": interrupted.train_step()[0]})
    interrupted.save()
    for _ in range(2):  # steps after the last save, then a kill: logged, never saved
        interrupted.log({"step": interrupted.step + 1, "loss": interrupted.train_step()[0]})
    (tmp_path / "b" / "checkpoint.pt.tmp").write_bytes(b"half a checkpoint")
    interrupted.release_lock()  # the kill: the kernel drops its lock
    resumed = Trainer(tiny(text_file, tmp_path / "b"), resume=True, progress=False)
    assert not (tmp_path / "b" / "checkpoint.pt.tmp").exists()
    resumed.run()
    assert steps_logged(tmp_path / "b") == [1, 2, 3, 4, 5, 6]
    for name, tensor in weights(tmp_path / "a").items():
        assert torch.equal(tensor, weights(tmp_path / "b")[name]), name


def test_checkpoints_follow_save_every_not_eval_every(text_file, tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(Trainer, "save", lambda self: saved.append(self.step))
    Trainer(tiny(text_file, tmp_path / "r", steps=7, save_every="3", eval_every=2), progress=False).run()
    assert saved == [3, 6, 7]
    assert parse_interval("10m") == (None, 600.0) and parse_interval("90s") == (None, 90.0) and parse_interval("200") == (200, None)
    for bad in ("0", "-5", "ten", "5x", "nanm"):
        with pytest.raises(ValueError, match="save_every"):
            parse_interval(bad)


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


SIGNALLED_STEPS = ["--steps", "200", "--threads", "1"]  # one thread everywhere: the same reductions, bit for bit


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """(corpus, the run of SIGNALLED_STEPS never stopped): the signalled runs' reference, trained once."""
    root = tmp_path_factory.mktemp("uninterrupted")
    corpus = root / "corpus.txt"
    corpus.write_bytes(("To be, or not to be, that is the question. " * 200).encode())
    threads = torch.get_num_threads()
    try:
        assert main(cli_train(str(corpus), root / "a", *SIGNALLED_STEPS)) == 0
    finally:
        torch.set_num_threads(threads)
    return str(corpus), root / "a"


def stopped_by(stop: signal.Signals, arguments: list[str], run, after: int, capsys) -> int:
    """``tokenmix`` run in this process, sent ``stop`` from another thread once ``after`` steps are logged (as
    from another process: Python runs the handler in the main thread); its exit status 130 and message checked.
    Returns the step it saved."""
    late, done = [], threading.Event()
    previous = signal.signal(stop, lambda *_: late.append(stop))  # a signal after training ended: recorded, not fatal

    def watch():
        deadline = time.time() + 120
        while len(steps_logged_safely(run)) < after and not done.is_set() and time.time() < deadline:
            time.sleep(0.02)
        if not done.is_set():
            os.kill(os.getpid(), stop)

    capsys.readouterr()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        status = main(arguments)
    finally:  # no signal sent once the handler is gone, whatever happened
        done.set()
        watcher.join()
        signal.signal(stop, previous)
    out, err = capsys.readouterr()
    assert status == 130 and not late, out + err
    assert "Traceback" not in err and "checkpoint saved" in err and "--resume" in err
    return load_checkpoint(run)["step"]


@pytest.mark.slow
def test_a_signal_saves_a_checkpoint_and_resume_finishes_the_same_run(uninterrupted, tmp_path, keep_threads, capsys):
    """SIGINT after 5 of 200 steps (each a few milliseconds: far from the end), a resume stopped by SIGTERM 5
    steps later, a resume to the end: the steps and weights of the uninterrupted run."""
    assert threading.current_thread() is threading.main_thread()  # where the handlers are installed
    text_file, straight = uninterrupted
    run = tmp_path / "b"
    first = stopped_by(signal.SIGINT, cli_train(text_file, run, *SIGNALLED_STEPS), run, 5, capsys)
    assert 5 <= first < 200
    second = stopped_by(signal.SIGTERM, ["train", "--resume", "--out", str(run)], run, first + 5, capsys)
    assert first + 5 <= second < 200
    assert main(["train", "--resume", "--out", str(run)]) == 0
    assert steps_logged(run) == list(range(1, 201))
    for name, tensor in weights(straight).items():
        assert torch.equal(tensor, weights(run)[name]), name


def steps_logged_safely(run) -> list[int]:
    try:
        return steps_logged(run)
    except (json.JSONDecodeError, FileNotFoundError):  # a line being written
        return []


def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(text_file, tmp_path, monkeypatch):
    trainer = Trainer(tiny(text_file, tmp_path / "r", steps=10, save_every="2"), progress=False)
    original = Trainer.train_step

    def poisoned(self):
        loss = original(self)
        if self.step == 5:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
            return float("nan"), loss[1]
        return loss

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    with pytest.raises(TrainingDiverged, match="loss became nan at step 5.*last good checkpoint"):
        trainer.run()
    state = load_checkpoint(tmp_path / "r")
    assert state["step"] == 4 and all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


def test_the_cli_reports_divergence_in_one_line(text_file, tmp_path, capsys):
    assert main(cli_train(text_file, tmp_path / "r", "--steps", "40", "--lr", "1e12", "--grad-clip", "0", "--save-every", "1")) == 1
    error = capsys.readouterr().err
    assert "became" in error and "last good checkpoint" in error and "Traceback" not in error
    state = load_checkpoint(tmp_path / "r")
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


def test_overwrite_touches_nothing_until_every_setting_is_checked(text_file, tmp_path):
    Trainer(tiny(text_file, tmp_path / "r", steps=2), progress=False).run()
    before = sorted(p.name for p in (tmp_path / "r").iterdir())
    with pytest.raises(ValueError, match="unknown option 'no_such_option'"):
        Trainer(tiny(text_file, tmp_path / "r", options={"no_such_option": 1}), progress=False, overwrite=True)
    with pytest.raises(ValueError, match="segment-recurrent"):
        Trainer(tiny("assoc-recall", tmp_path / "r", model="transformer_xl", options={}), progress=False, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == before and load_checkpoint(tmp_path / "r")["step"] == 2


def test_a_resume_rebuilds_the_saved_model_after_a_default_changed(text_file, tmp_path, monkeypatch):
    from dataclasses import dataclass

    from tokenmix.fields import Number, setting
    from tokenmix.mixers.tno import Tno, TnoOptions

    @dataclass
    class NewDefaults(TnoOptions):
        decay: float = setting(0.5, Number(0, 1, open_minimum=True), "a changed default")

    Trainer(tiny(text_file, tmp_path / "r", steps=2), progress=False).run()
    monkeypatch.setattr(Tno, "options_type", NewDefaults)
    resumed = Trainer(tiny(text_file, tmp_path / "r", steps=3), resume=True, progress=False)
    assert resumed.model.config.options["mixer"]["decay"] == 0.99
    resumed.run()
    assert load_checkpoint(tmp_path / "r")["step"] == 3


def test_a_run_stopped_at_its_last_step_is_finished_by_a_resume(text_file, tmp_path):
    """Saved at the last step, killed before the final evaluation: a resume writes model/ and the final record."""
    trainer = Trainer(tiny(text_file, tmp_path / "r", steps=3), progress=False)
    for _ in range(3):
        trainer.train_step()
    trainer.save()
    trainer.release_lock()  # killed here: the kernel drops its lock
    assert not (tmp_path / "r" / "model").exists()
    Trainer(tiny(text_file, tmp_path / "r", steps=3), resume=True, progress=False).run()
    assert (tmp_path / "r" / "model" / "config.json").is_file()
    assert [r["step"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if r.get("final")] == [3]
    with pytest.raises(ValueError, match="already finished at step 3"):
        Trainer(tiny(text_file, tmp_path / "r", steps=3), resume=True, progress=False)


def test_a_moved_run_resumes_and_a_torn_metrics_line_is_dropped(text_file, tmp_path):
    Trainer(tiny(text_file, tmp_path / "r", steps=2), progress=False).run()
    (tmp_path / "r").rename(tmp_path / "moved")
    with open(tmp_path / "moved" / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 3, "lo')  # a kill in the middle of a write
    Trainer(tiny(text_file, tmp_path / "moved", steps=3), resume=True, progress=False).run()
    state = load_checkpoint(tmp_path / "moved")
    assert state["step"] == 3 and state["train_config"]["out"] == str(tmp_path / "moved")
    assert state["resumes"][-1]["changed"]["out"] == [str(tmp_path / "r"), str(tmp_path / "moved")]
    assert steps_logged(tmp_path / "moved") == [1, 2, 3]


def test_time_budget_runs_resume_extend_and_refuse_a_shorter_budget(text_file, tmp_path):
    budget = dict(steps=None, minutes=0.01)
    first = Trainer(tiny(text_file, tmp_path / "r", **budget), progress=False)
    first.run()
    with pytest.raises(ValueError, match="already finished"):
        Trainer(tiny(text_file, tmp_path / "r", **budget), resume=True, progress=False)
    with pytest.raises(ValueError, match="shorter than the run's"):
        Trainer(tiny(text_file, tmp_path / "r", steps=None, minutes=0.005), resume=True, progress=False)
    longer = Trainer(tiny(text_file, tmp_path / "r", steps=None, minutes=0.2), resume=True, progress=False)
    pace = first.train_seconds / first.step
    assert longer.total_steps == first.step + int((0.2 * 60 * 0.9 - first.train_seconds) / pace)  # the rest, at the run's pace
    assert longer.total_steps > first.total_steps and longer.resumes[-1]["changed"] == {"minutes": [0.01, 0.2]}


def test_time_based_saves_happen_during_a_run(text_file, tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(Trainer, "save", lambda self: saved.append(self.step))
    Trainer(tiny(text_file, tmp_path / "r", steps=5, save_every="0.001s"), progress=False).run()
    assert saved == [1, 2, 3, 4, 5]  # each step takes longer than a millisecond


def test_a_resume_refuses_changed_data_files_by_name_unless_allowed(tmp_path, capsys):
    """Fails if the checkpoint does not record the data files (size and SHA-256) or the resume does not compare them."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.txt", "b.txt"):
        (corpus / name).write_bytes((f"{name} to be or not to be. " * 100).encode())
    run = tmp_path / "run"
    assert main(cli_train(str(corpus), run, "--steps", "2")) == 0
    assert set(load_checkpoint(run)["data_files"]) == {"a.txt", "b.txt"}
    (corpus / "b.txt").write_bytes((corpus / "b.txt").read_bytes().replace(b"be", b"BE"))  # same size
    error = usage_error(["train", "--resume", "--out", str(run), "--steps", "3"], capsys)
    assert "b.txt: same size, different content" in error and "a.txt" not in error and "--allow-data-change" in error
    size = (corpus / "a.txt").stat().st_size
    (corpus / "a.txt").write_bytes(b"short " * 100)
    error = usage_error(["train", "--resume", "--out", str(run), "--steps", "3"], capsys)
    assert f"a.txt: {size} bytes, now 600" in error
    assert main(["train", "--resume", "--out", str(run), "--steps", "3", "--allow-data-change"]) == 0
    (resume,) = load_checkpoint(run)["resumes"]
    assert resume["changed"]["data_files"] == [f"a.txt: {size} bytes, now 600", "b.txt: same size, different content"]
    assert main(["train", "--resume", "--out", str(run), "--steps", "4"]) == 0  # the new files are the record now


def test_folders_of_many_files_are_fingerprinted_as_one_entry(tmp_path, monkeypatch):
    from tokenmix.data import provenance

    monkeypatch.setattr(provenance, "PER_FILE_LIMIT", 2)
    for index in range(3):
        (tmp_path / "many").mkdir(exist_ok=True)
        (tmp_path / "many" / f"{index}.png").write_bytes(bytes([index]) * 10)
    (tmp_path / "labels.txt").write_bytes(b"0 1 2")
    with provenance.record_reads() as reads:
        for path in [*sorted((tmp_path / "many").iterdir()), tmp_path / "labels.txt"]:
            provenance.note_read(path)
    before = reads.fingerprints()
    assert set(before) == {"many/*", "labels.txt"} and before["many/*"]["files"] == 3 and before["many/*"]["bytes"] == 30
    (tmp_path / "many" / "1.png").write_bytes(b"\x09" * 10)
    assert provenance.data_changes(before, reads.fingerprints()) == ["many/*: same size, different content"]
