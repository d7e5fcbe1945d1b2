"""Chaos: training killed (SIGKILL, no clean-up) at random moments, again and again, restarted with
``--resume auto`` (one process) or by torchrun's ``--max-restarts`` (two), ends with the losses of a run
that was never interrupted, bit for bit; and a hung process stops the job in one line instead of hanging it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STEPS = 100
TRAIN = ["-m", "tokenmix.cli", "train", "--resume", "auto", "--dim", "16", "--depth", "1", "--seq-len", "32", "--batch-size", "2"]
TRAIN += ["-o", "rpe_dim=4", "--steps", str(STEPS), "--save-every", "1", "--eval-every", str(STEPS), "--eval-tokens", "64"]
TRAIN += ["--final-eval-tokens", "256", "--sample-tokens", "8", "--threads", "1"]
ENVIRONMENT = {**os.environ, "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.chaos


def torchrun(processes: int, *flags: str) -> list[str]:
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), *flags] if processes > 1 else []
    return [sys.executable, *launcher]


def losses(run: Path) -> dict:
    """Each step's training loss and the final validation loss, as the run's metrics record them."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {record["step"]: record["loss"] for record in records if "split" not in record and "event" not in record}
    return {"steps": steps, "final": [record["loss"] for record in records if record.get("final")]}


def trained_since(run: Path, moment: float) -> bool:
    """A training step recorded after ``moment`` (the workers' start)."""
    path = run / "metrics.jsonl"
    try:
        if path.stat().st_mtime <= moment:
            return False
        return any('"loss"' in line and '"event"' not in line for line in path.read_text().splitlines())
    except OSError:
        return False


def last_step(run: Path) -> int:
    """The last training step the run's metrics record (0 before any)."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [json.loads(line)["step"] for line in lines[:-1] if '"loss"' in line and '"event"' not in line and '"split"' not in line]
    return max(steps, default=0)


def workers(parent: int) -> list[int]:
    """The PIDs of ``parent``'s child processes (torchrun's workers)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                children.append(int(entry.name))
    return children


def kill_repeatedly(command: list[str], run: Path, kills: int, seed: int, processes: int) -> int:
    """Run ``command`` until it succeeds, SIGKILLing (one of) its training process(es) ``kills`` times, each
    time a random moment after it has trained a step; returns the kills made (it may finish first)."""
    rng, made, log = random.Random(seed), 0, run.with_name(run.name + ".log")

    def start() -> subprocess.Popen:  # output to a file: a pipe nobody reads would fill and block the job
        with open(log, "ab") as output:
            return subprocess.Popen(command, stdout=output, stderr=output, env=ENVIRONMENT)

    job = start()
    try:
        while True:
            started, targets = time.time(), []
            while job.poll() is None and not (targets and trained_since(run, started)):
                targets = [job.pid] if processes == 1 else workers(job.pid)
                time.sleep(0.05)
            if job.poll() is not None:
                if job.returncode == 0 or made >= kills:
                    return made
                raise AssertionError(log.read_text()[-3000:])
            goal = last_step(run) + rng.randint(0, 1)  # a kill at most two steps on, however fast the machine
            while job.poll() is None and last_step(run) < goal:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.05))  # mid-step, mid-save, mid-evaluation: wherever it is
            if made == kills:
                job.wait(timeout=600)
                assert job.returncode == 0, log.read_text()[-3000:]
                return made
            try:
                os.kill(rng.choice(targets), signal.SIGKILL)
            except ProcessLookupError:  # it ended first (its run finished, or torchrun replaced its group): look again
                continue
            made += 1
            if processes == 1:
                job.wait()
                job = start()
    finally:
        if job.poll() is None:
            job.kill()


@pytest.mark.slow
@pytest.mark.parametrize("processes, kills", [(1, 20), (2, 10)])
def test_random_kills_change_nothing(tmp_path, text_file, processes, kills):
    """``kills`` SIGKILLs during training (checkpoints every step): every step's loss and the final
    validation loss equal those of the run never killed."""
    data = ["--data", text_file]
    straight = subprocess.run(
        [*torchrun(processes), *TRAIN, *data, "--out", str(tmp_path / "straight")], capture_output=True, env=ENVIRONMENT
    )
    assert straight.returncode == 0, straight.stderr.decode()[-3000:]
    command = [*torchrun(processes, "--max-restarts", str(kills + 5)), *TRAIN, *data, "--out", str(tmp_path / "killed")]
    made = kill_repeatedly(command, tmp_path / "killed", kills, seed=processes, processes=processes)
    print(f"{processes} process(es): {made} kills survived")
    assert made == kills
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")
    assert len(losses(tmp_path / "killed")["steps"]) == STEPS


@pytest.mark.slow
def test_a_hung_process_stops_the_job_in_one_line(tmp_path, text_file):
    """Rank 1 stopped (SIGSTOP: alive but silent) mid-training: rank 0 gives up after --collective-timeout
    with one line naming its rank and what it waited for, and torchrun ends the job."""
    run = tmp_path / "run"
    flags = [*TRAIN, "--data", text_file, "--steps", "100000", "--collective-timeout", "5", "--out", str(run)]
    log = tmp_path / "job.log"
    with open(log, "w") as output:  # a file: a pipe nobody reads would fill and block the job
        job = subprocess.Popen([*torchrun(2), *flags], stdout=output, stderr=output, env=ENVIRONMENT)
    try:
        started = time.time()
        while not trained_since(run, started):
            assert job.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        rank_1 = next(pid for pid in workers(job.pid) if b"RANK=1\0" in Path(f"/proc/{pid}/environ").read_bytes())
        os.kill(rank_1, signal.SIGSTOP)
        stopped = time.perf_counter()
        job.wait(timeout=300)
        print(f"the job ended {time.perf_counter() - stopped:.1f} s after rank 1 hung (collective timeout 5 s)")
        assert job.returncode != 0
        line = next((line for line in log.read_text().splitlines() if line.startswith("tokenmix train: ")), "")  # its own line
        print(line)
        assert "rank 0 of 2 stopped waiting for the other processes during training (collective timeout 5 s)" in line, log.read_text()[
            -3000:
        ]
    finally:
        for pid in workers(job.pid) if job.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        job.kill()
