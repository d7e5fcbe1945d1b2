import errno
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

LENGTHS = (1, 7, 100, 1000, 1024)

# The fused Triton kernels (tokenmix/ops/fused_toeplitz.py) run on CPU tensors only in Triton's interpreter, which
# triton.jit picks when it decorates a kernel, reading TRITON_INTERPRET. tokenmix decorates its kernels on first use,
# so the variable is set here, when pytest loads this file and before any test can import triton; and only on a
# machine without a CUDA device, where the kernels are then compiled and tested on the GPU. Nothing else reads it:
# off the GPU every mixer takes PyTorch's path, whatever the variable says (ops.fused_toeplitz.fused_wanted).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tokenmix.ops.fused_toeplitz import INTERPRETER_FAULT  # noqa: E402  (after the variable: it may import triton)

TRITON = importlib.util.find_spec("triton") is not None
NO_TRITON = "the fused kernels need triton: pip install 'tokenmix[fused]'"
# Tests that compile the kernels for GPU targets (no GPU needed).
NEEDS_TRITON = pytest.mark.skipif(not TRITON, reason=NO_TRITON)
# Tests that run the kernels: on the GPU, else on CPU tensors in Triton's interpreter (set above).
RUNS_TRITON = pytest.mark.skipif(
    not TRITON or (not torch.cuda.is_available() and INTERPRETER_FAULT is not None), reason=INTERPRETER_FAULT or NO_TRITON
)
# Tests that run the kernels on CPU tensors only: in Triton's interpreter, set above where no GPU is seen.
FUSED_ON_CPU = TRITON and "TRITON_INTERPRET" in os.environ and INTERPRETER_FAULT is None
INTERPRETED_TRITON = pytest.mark.skipif(
    not FUSED_ON_CPU, reason=INTERPRETER_FAULT or ("a GPU is seen, so no interpreter (conftest.py)" if TRITON else NO_TRITON)
)


def history_kernel_launches(monkeypatch) -> list[tuple[tuple, list[int]]]:
    """The static decoding step's fused kernel (``ops/history_toeplitz.py``) spied on from now on: each launch noted as
    (its grid, the rows' positions), then run."""
    from tokenmix.ops import history_toeplitz

    launches, (triton, kernel) = [], history_toeplitz._kernel()

    class Launches:
        def __getitem__(self, grid):
            return lambda *args, **options: launches.append((grid, args[1].tolist())) or kernel[grid](*args, **options)

    monkeypatch.setattr(history_toeplitz, "_kernel", lambda: (triton, Launches()))
    return launches


def compiled_for_gpus(code: str, tmp_path: Path) -> list[list[str]]:
    """The lines ``code`` prints, split, run in a process without TRITON_INTERPRET and with an empty kernel cache: code
    that compiles Triton kernels for GPU targets (down to ptxas, which the interpreter never runs) and prints a line per
    cubin, its size last."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return [line.split() for line in result.stdout.splitlines()]


def pytest_configure(config):
    """Under pytest-xdist each worker computes on its share of the CPUs: two workers of two threads each on
    two cores would oversubscribe them (libgomp's spinning teams slow every small operation)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cpus // int(workers)))
    # Inductor compiles its kernels in this process rather than starting a pool of compiling processes (each of
    # which imports torch): the same kernels, without the pool's start-up on a machine the workers already fill.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the modules holding the chaos and the slow tests first (``--no-loadscope-reorder``
    keeps this order), so that no worker starts a long module while the others run out of work."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        weight = {}
        for item in items:
            rank = 0 if item.get_closest_marker("chaos") else 1 if item.get_closest_marker("slow") else 2
            weight[item.module] = min(weight.get(item.module, 2), rank)
        items.sort(key=lambda item: weight[item.module])


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _cache(tmp_path_factory):
    """The data cache of the session (learnt BPEs, token ids, generated ListOps) is its own, not the user's."""
    os.environ["TOKENMIX_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(("To be, or not to be, that is the question. " * 200).encode())
    return str(path)


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-30))


# Tensor factories: one that names no device in a captured graph makes its tensor on the host, whatever device the
# module runs on; on a GPU its copy to the device waits for every kernel queued before it, and a CUDA graph cannot
# capture it.
FACTORIES = {
    torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.arange, torch.zeros, torch.ones, torch.full, torch.empty,
    torch.eye, torch.linspace, torch.rand, torch.randn, torch.randint,
}  # fmt: skip


def host_made_tensors(graph: torch.fx.GraphModule) -> list[str]:
    """The source lines where a graph captured by ``torch.compile`` (its subgraphs included, such as a custom autograd
    Function's backward) makes a tensor without naming its device (or naming None)."""
    found = []
    for module in graph.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if node.op == "call_function" and node.target in FACTORIES and node.kwargs.get("device") is None:
                    found.append(node.meta.get("stack_trace", "").strip().splitlines()[-2:])
    return found


class OperatorsCalled(TorchDispatchMode):
    """The ATen operators run inside ``with OperatorsCalled() as called:``, by name in ``called.operators``."""

    def __enter__(self):
        self.operators: list[str] = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.operators.append(func.name())
        return func(*args, **(kwargs or {}))


def assert_causal_gradient(grad: torch.Tensor, position: int, tolerance: float = 1e-12) -> None:
    """Gradient of output ``position`` w.r.t. a (batch, length, ...) input: none toward the future.

    FFT-based operators leak only round-off (every output of a length-N transform carries some),
    so "zero" is checked relative to the gradient toward the past: 1e-12 suits float64.
    """
    past = grad[:, : position + 1].abs().max()
    future = grad[:, position + 1 :].abs().max() if grad.shape[1] > position + 1 else torch.tensor(0.0)
    assert past > 0
    assert future <= tolerance * past, f"gradient leaks to the future: {float(future):.3g} vs {float(past):.3g}"


def random_chunks(n: int, seed: int = 0) -> list[slice]:
    """Consecutive slices covering range(n): sizes 1 to 8 over the first half, then one chunk for the rest."""
    generator, chunks, start = torch.Generator().manual_seed(seed), [], 0
    while start < n:
        size = int(torch.randint(1, 9, (1,), generator=generator)) if start < n // 2 else n - start
        chunks.append(slice(start, start + size))
        start += size
    return chunks


@pytest.fixture
def aan(tmp_path):
    """LRA retrieval files in the release's layout: tsv_data/new_aan_pairs.{train,eval,test}.tsv; (folder, rows)."""
    folder = tmp_path / "lra_release" / "tsv_data"
    folder.mkdir(parents=True)
    rows = {}
    for split, count in (("train", 6), ("eval", 2), ("test", 3)):
        rows[split] = []
        with open(folder / f"new_aan_pairs.{split}.tsv", "wb") as file:
            for k in range(count):
                label = "1.0" if k == 0 else str(k % 2)
                first, second = f"{split} paper {k} \u00e9 {'a' * (20 * k)}".encode(), f"cited {k} 'quoted' \"text\"".encode()
                file.write(b"\t".join([label.encode(), f"P{k}-1001".encode(), f"W{k}-2002".encode(), first, second]) + b"\n")
                rows[split].append((int(float(label)), first, second))
    return folder, rows


def usage_error(arguments, capsys) -> str:
    """The message of a command refused for its input: exit status 2, one line, no traceback."""
    from tokenmix.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error and error.count("\n") == 1, error
    return error


TINY_RUN = ["--dim", "8", "--depth", "1", "--seq-len", "16", "--batch-size", "2", "--warmup", "0"]
TINY_RUN += ["--eval-tokens", "64", "--sample-tokens", "16"]


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> dict:
    """Run directories made once per session (copy before changing them): a causal LM ("lm"), a
    masked LM ("mlm"), and the LM exported for transformers ("export", when the hf extra is installed)."""
    from tokenmix.cli import main

    root = tmp_path_factory.mktemp("tiny_runs")
    corpus = root / "corpus.txt"
    corpus.write_bytes(("To be, or not to be, that is the question. " * 200).encode())
    runs = {}
    for task in ("lm", "mlm"):
        runs[task] = root / task
        flags = ["--data", str(corpus), *TINY_RUN, "--steps", "1", "--task", task, "-o", "rpe_dim=4"]
        assert main(["train", *flags, "--out", str(runs[task]), "--threads", "1"]) == 0
    try:
        import transformers  # noqa: F401
    except ImportError:
        return runs
    runs["export"] = root / "export"
    assert main(["export-hf", str(runs["lm"]), str(runs["export"])]) == 0
    return runs


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MiB tmpfs (root only: skipped elsewhere), unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root: " + mounted.stderr.decode(errors="replace").strip())
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: Path) -> None:
    """Write a filler file until the disk is full."""
    with open(disk / "filler", "wb", buffering=0) as filler:
        chunk = b"\0" * 65536
        with pytest.raises(OSError) as full:
            while True:
                filler.write(chunk)
        assert full.value.errno == errno.ENOSPC
        while len(chunk) > 1:  # the last partial pages too
            chunk = chunk[: len(chunk) // 2]
            try:
                while True:
                    filler.write(chunk)
            except OSError:
                pass
