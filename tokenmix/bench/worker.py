"""Run one benchmark case in this (fresh) process: ``python -m tokenmix.bench.worker CASE_JSON REPEATS THREADS``.

Prints the measurement as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from ..runtime import retain_freed_memory
from .cases import Case
from .measure import Measurement, measure


def run_in_subprocess(case: Case, repeats: int, threads: int) -> Measurement:
    """Measure ``case`` in a fresh Python process (clean peak-RSS accounting on CPU)."""
    command = [sys.executable, "-m", "tokenmix.bench.worker", json.dumps(case.to_dict()), str(repeats), str(threads)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {case}:\n{result.stderr[-2000:]}")
    return Measurement(**json.loads(result.stdout.strip().splitlines()[-1]))


def main(argv: list[str]) -> None:
    case_json, repeats, threads = argv
    retain_freed_memory()
    torch.set_num_threads(int(threads))
    print(json.dumps(measure(Case(**json.loads(case_json)), int(repeats)).to_dict()))


if __name__ == "__main__":
    main(sys.argv[1:])
