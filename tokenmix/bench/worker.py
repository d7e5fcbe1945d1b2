"""Run one benchmark case in this (fresh) process: ``python -m tokenmix.bench.worker CASE_JSON REPEATS THREADS PROFILE``.

Prints the measurement as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from ..runtime import retain_freed_memory
from .cases import Case
from .measure import measure
from .records import Record, failed_measurement, from_dict


def run_in_subprocess(case: Case, repeats: int, threads: int, profile: bool = False) -> Record:
    """Measure ``case`` in a fresh Python process (clean peak-RSS accounting on CPU); a failure becomes a record with ``error``."""
    command = [sys.executable, "-m", "tokenmix.bench.worker", json.dumps(case.to_dict()), str(repeats), str(threads), str(int(profile))]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        return failed_measurement(case, lines[-1] if lines else f"worker exited with status {result.returncode}")
    return from_dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main(argv: list[str]) -> None:
    case_json, repeats, threads, profile = argv
    retained = retain_freed_memory()
    torch.set_num_threads(int(threads))
    measurement = measure(Case(**json.loads(case_json)), int(repeats), profile=profile == "1")
    measurement.retain_freed_memory = retained
    print(json.dumps(measurement.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1:])
