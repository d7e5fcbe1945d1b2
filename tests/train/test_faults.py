"""Nothing lost under faults: every write site under a full disk, a read-only file system and an I/O
error (one line naming the file, the previous version whole, no temporary left), and one writer per run."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import fill, usage_error

import tokenmix
from tokenmix.cli import main
from tokenmix.data.cache import store
from tokenmix.data.tokenizer import byte_tokenizer
from tokenmix.errors import MachineFault
from tokenmix.hf.export import export
from tokenmix.io.files import save_figure, write_json_atomic
from tokenmix.models.saving import save_pretrained
from tokenmix.runs.checkpoint import load_checkpoint, save_checkpoint
from tokenmix.runs.layout import METRICS_FILE
from tokenmix.runs.metrics import read_metrics
from tokenmix.runs.sharded import save_shards
from tokenmix.train.directory import append_metrics
from tokenmix.train.lock import LOCK_FILE, RunLock

PAD = "x" * 20_000  # every version needs pages the full disk no longer has


def tiny_model(version: int):
    torch.manual_seed(version)
    return tokenmix.build_model("tnn", vocab_size=256, dim=64, depth=2)


def sharded(folder: Path, version: int) -> None:
    model = tiny_model(version)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 256, (1, 8))).sum().backward()
    optimizer.step()
    save_shards(folder, version, model, optimizer, True, lambda: None)


def figure(folder: Path, version: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots()
    axis.plot(range(1000), [version] * 1000)
    axis.set_title(PAD[:200])
    try:
        save_figure(fig, folder / "plot.png")
    finally:
        plt.close(fig)


# Each site writes (a new version of) its file into a run-like folder, as tokenmix does.
WRITE_SITES = {
    "checkpoint": lambda folder, version: save_checkpoint(folder / "checkpoint.pt", {"model": tiny_model(version).state_dict()}),
    "sharded checkpoint": sharded,
    "model export": lambda folder, version: save_pretrained(tiny_model(version), folder / "model"),
    "transformers export": lambda folder, version: export(tiny_model(version), folder / "hf", byte_tokenizer(), overwrite=True),
    "tokenizer": lambda folder, version: byte_tokenizer().save(folder / "tokenizer.json"),
    "metrics": lambda folder, version: append_metrics(folder, {"step": version, "note": PAD}),
    "eval, bench and distil JSON": lambda folder, version: write_json_atomic(folder / "eval.json", {"version": version, "note": PAD}),
    "data cache": lambda folder, version: store(folder / "cache" / "ids.npy", lambda file: file.write(PAD.encode() * version)),
    "plot": figure,
}
REASONS = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only", errno.EIO: "an I/O error"}


def contents(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def fault_at_every_write(monkeypatch, number: int) -> None:
    """Injected: each write that reaches the disk (``os.write``, ``fsync``) fails with ``number``."""

    def fail(*_, **__):
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(os, "fsync", fail)
    monkeypatch.setattr(os, "write", fail)


def check_fault(site: str, folder: Path, make_fault, number: int) -> None:
    """The site's first version written, then a fault, then its second: one MachineFault line naming
    the file and the reason; the first version byte for byte as it was; no temporary file left."""
    WRITE_SITES[site](folder, 1)
    before = contents(folder)
    make_fault()
    with pytest.raises(MachineFault) as fault:
        WRITE_SITES[site](folder, 2)
    message = str(fault.value)
    assert "\n" not in message and str(folder) in message and REASONS[number] in message, message
    if number == errno.ENOSPC:
        assert " free)" in message, message
    after = {name: data for name, data in contents(folder).items() if name != "filler"}
    assert after == before, sorted(set(after) ^ set(before))


@pytest.mark.parametrize("site", WRITE_SITES)
def test_a_full_disk_at_each_write_site(site, small_disk):
    check_fault(site, small_disk, lambda: fill(small_disk), errno.ENOSPC)


@pytest.mark.parametrize("site", WRITE_SITES)
def test_a_read_only_file_system_at_each_write_site(site, small_disk):
    remount = ["mount", "-o", "remount,ro", str(small_disk)]
    check_fault(site, small_disk, lambda: subprocess.run(remount, check=True), errno.EROFS)


@pytest.mark.parametrize("site", WRITE_SITES)
@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EROFS, errno.EIO])
def test_an_injected_error_at_each_write_site(site, number, tmp_path, monkeypatch):
    check_fault(site, tmp_path, lambda: fault_at_every_write(monkeypatch, number), number)


def test_a_full_disk_stops_training_in_one_line_and_keeps_the_last_checkpoint(small_disk, text_file, capsys):
    """The command line on a real full disk: exit status 1, one line naming the file, the previous
    checkpoint still resumable once there is room."""
    run = small_disk / "run"
    flags = ["--data", text_file, "--dim", "16", "--depth", "1", "--seq-len", "32", "--batch-size", "2", "-o", "rpe_dim=4"]
    flags += ["--eval-tokens", "64", "--final-eval-tokens", "64", "--out", str(run)]
    assert main(["train", *flags, "--steps", "2"]) == 0
    saved = (run / "checkpoint.pt").read_bytes()
    fill(small_disk)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--resume", "--out", str(run), "--steps", "4", "--save-every", "1"])
    assert stopped.value.code == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"tokenmix train: cannot write '{run}/") and "the disk is full" in error, error  # the first write: metrics
    assert (run / "checkpoint.pt").read_bytes() == saved and not list(run.glob("*.tmp"))
    assert read_metrics(run / METRICS_FILE)  # whole records only
    (small_disk / "filler").unlink()
    assert main(["train", "--resume", "--out", str(run), "--steps", "4"]) == 0


def test_a_second_writer_is_refused_and_a_killed_one_blocks_nothing(tmp_path, text_file, capsys):
    """While ``tokenmix train`` runs in another process, a second ``train --resume`` of its folder (this
    process) is refused at once, naming the holder's PID; once the first is killed (SIGKILL: no clean-up
    ran), a resume takes the run over."""
    run = tmp_path / "run"
    flags = ["--data", text_file, "--dim", "16", "--depth", "1", "--seq-len", "32", "--batch-size", "2", "-o", "rpe_dim=4"]
    flags += ["--eval-tokens", "64", "--final-eval-tokens", "64", "--save-every", "1", "--out", str(run), "--threads", "1"]
    command = [sys.executable, "-m", "tokenmix.cli", "train"]
    first = subprocess.Popen([*command, *flags, "--steps", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    threads = torch.get_num_threads()
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoint.pt").exists():  # it holds the lock and has saved once
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.2)
        error = usage_error(["train", "--resume", "--out", str(run), "--steps", "100001"], capsys)
        assert f"PID {first.pid}" in error and "one run has one writer" in error, error
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    try:
        assert (run / LOCK_FILE).exists()  # left by the killed writer, and no obstacle:
        step = load_checkpoint(run)["step"]
        assert main(["train", "--resume", "--out", str(run), "--steps", str(step + 1), "--sample-tokens", "16"]) == 0
    finally:
        torch.set_num_threads(threads)  # the run's --threads 1
    assert load_checkpoint(run)["step"] == step + 1 and not (run / LOCK_FILE).exists()


def test_one_writer_in_one_process_too(tmp_path):
    """Locks are per open file: a second lock of the same folder in the same process is refused as well."""
    with RunLock(tmp_path / "run", "train"):
        with pytest.raises(ValueError, match=rf"is being written by another process \(tokenmix train, PID {os.getpid()} on host"):
            RunLock(tmp_path / "run", "distil")
    assert not (tmp_path / "run").exists()  # a run that never started leaves no folder behind


def test_the_lock_names_a_holder_that_is_still_starting(tmp_path):
    (tmp_path / "run").mkdir()
    with RunLock(tmp_path / "run", "train") as lock:
        lock.handle.truncate(0)
        with pytest.raises(ValueError, match="it is starting"):
            RunLock(tmp_path / "run", "train")
    assert not (tmp_path / "run" / LOCK_FILE).exists()
