"""``tokenmix bench --kinds scale`` under torchrun: what context parallelism buys each process.

For each P of ``--processes`` (at most the processes torchrun started; the largest first, so the
most memory is asked last) the first P processes form a group and train one model at a time on
sequences of each ``--lengths`` length split over them (``tokenmix.parallel``; batch 1, depth
``--depth``, width ``--model-dim``); the others wait, idle. Steps run with the allocator setting
``tokenmix train`` runs with (``runtime.retain_freed_memory``: freed blocks kept for reuse), and each
group hands its freed memory back (``malloc_trim``) before the next starts, so processes sharing a
machine do not each keep their peak. Per process, the largest over the group:

- ``activation_bytes``: what autograd keeps for the backward (distinct storages seen by
  saved-tensor hooks, weights excluded): the memory that grows with the length;
- ``step_ms``: median of ``--repeats`` training steps after a warm-up (forward, backward and the
  gradient all-reduce over the group), each started together (a barrier);
- ``communication_share``: the share of one more step spent inside collectives (torch.profiler's
  self time of c10d and functional-collective operators, waiting included);
- ``exchanged_bytes``: what this process's exchanges send to the others in the forward (the backward
  sends as many back); ``gradient_bytes``: the gradients each all-reduce carries.

With ``--memory-budget GIB`` each P also gets ``longest_length``: the longest sequence whose
activation bytes per process fit the budget (from the shortest ``--lengths`` value, doubling, then
halving the gap eight times), measured, not extrapolated.
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..io.table import format_table
from ..models.model import build_model
from ..parallel import ContextParallel
from ..parallel.exchange import traffic
from ..runtime import release_freed_memory
from ..train.memory import saved_tensor_bytes
from ..train.objectives import shard_cross_entropy
from .cases import DTYPES, MODEL_VOCAB

SCALE_KINDS = ("scale", "scale_limit")
SCALE = {  # the defaults of --kinds scale
    "models": ["tnn", "fd_tnn", "ski_tnn", "tcnca", "transformer"],
    "lengths": [16384, 32768, 65536],
    "model_dim": 256,
    "depth": 4,
    "repeats": 3,
}
COLLECTIVES = ("c10d", "alltoall", "all_to_all", "allreduce", "all_reduce")  # in the names of the profiler's communication operators
BISECTIONS = 8
MIB = 2**20


class ScaleRun:
    """One model split over the first ``processes`` processes at a time (``group``: theirs)."""

    def __init__(self, name: str, processes: int, group, args):
        self.processes, self.group, self.device = processes, group, torch.device(args.device)
        torch.manual_seed(0)
        self.model = build_model(name, vocab_size=MODEL_VOCAB, dim=args.model_dim, depth=args.depth)
        self.model.to(self.device, DTYPES[args.dtype]).train()
        self.split = ContextParallel(self.model, group, dist.get_rank(group), processes) if processes > 1 else None
        self.weights = {parameter.untyped_storage().data_ptr() for parameter in self.model.parameters()}

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """This process's share of the next-token loss of ``tokens`` (1, length + 1)."""
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        if self.split is None:
            return shard_cross_entropy(self.model(inputs), targets)
        shard = self.split.shard(inputs.shape[1])
        own = slice(shard.start, shard.stop)  # each process reads its shard's tokens alone, as a training step does
        return shard_cross_entropy(self.split(inputs[:, own], length=inputs.shape[1]), targets[:, own], shard.group)

    def step(self, tokens: torch.Tensor) -> None:
        self.model.zero_grad(set_to_none=True)
        self.loss(tokens).backward()
        if self.split is not None:
            gradients = torch.cat([parameter.grad.flatten() for parameter in self.model.parameters()])
            dist.all_reduce(gradients, group=self.group)

    def tokens(self, length: int) -> torch.Tensor:
        return torch.randint(0, MODEL_VOCAB, (1, length + 1), generator=torch.Generator().manual_seed(length)).to(self.device)

    def activation_bytes(self, length: int) -> int:
        """Bytes autograd keeps for the backward of this process's share of one step, the most over the group."""
        tokens = self.tokens(length)
        return int(self.group_max(saved_tensor_bytes(lambda: self.loss(tokens), self.weights)))

    def group_max(self, value: float) -> float:
        if self.split is None:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return float(tensor)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.split is not None:
            dist.barrier(group=self.group)

    def measure(self, length: int, repeats: int) -> dict:
        tokens = self.tokens(length)
        with traffic() as sent:
            self.step(tokens)  # warm-up
        times = []
        for _ in range(repeats):
            self.synchronize()
            started = time.perf_counter()
            self.step(tokens)
            self.synchronize()
            times.append(time.perf_counter() - started)
        step_ms = self.group_max(statistics.median(times) * 1e3)
        return {
            "activation_bytes": self.activation_bytes(length),
            "step_ms": step_ms,
            "communication_share": self.group_max(self.communication_share(tokens)),
            "exchanged_bytes": int(self.group_max(sent[0])),
            "gradient_bytes": sum(p.numel() * p.element_size() for p in self.model.parameters()) if self.split is not None else 0,
        }

    def communication_share(self, tokens: torch.Tensor) -> float:
        """The share of one step (profiled by torch.profiler, its own wall time) spent in collectives."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.synchronize()
        started = time.perf_counter()
        with profile(activities=activities) as profiler:
            self.step(tokens)
            self.synchronize()
        seconds = time.perf_counter() - started
        attribute = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        events = [event for event in profiler.key_averages() if any(word in event.key.lower() for word in COLLECTIVES)]
        return min(1.0, sum(getattr(event, attribute) for event in events) / 1e6 / seconds)

    def longest_length(self, shortest: int, budget: int) -> tuple[int, int]:
        """(length, its activation bytes): the longest whose activations fit ``budget`` bytes per process."""
        fits, fitting_bytes, fails = None, 0, shortest
        while True:
            used = self.activation_bytes(fails)
            if used > budget:
                break
            fits, fitting_bytes, fails = fails, used, fails * 2
        low = fits or 0
        for _ in range(BISECTIONS):
            middle = (low + fails) // 2
            if middle <= max(low, self.processes - 1):
                break
            used = self.activation_bytes(middle)
            if used <= budget:
                low, fitting_bytes = middle, used
            else:
                fails = middle
        return low, fitting_bytes


def scale_records(args, revision: str | None, measured=lambda records: None) -> list[dict]:
    """Every measurement of ``--kinds scale`` (all processes call it; rank 0's list is the whole);
    ``measured(records)`` after each new one (``--output`` keeps what a killed run measured)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    processes = [count for count in args.processes if count <= world]
    groups = {count: dist.new_group(list(range(count))) if count > 1 else None for count in processes}  # every rank makes every group
    settings = {"dim": args.model_dim, "depth": args.depth, "batch": 1, "threads": args.threads, "device": args.device}
    settings |= {"dtype": args.dtype, "world_size": world, "git_commit": revision}
    records = []
    for name in args.models:
        for count in sorted(processes, reverse=True):  # the most memory last: what a process kept from before is reused, not added
            if rank < count:
                run = ScaleRun(name, count, groups[count], args)
                if args.memory_budget is not None:
                    budget = int(args.memory_budget * 2**30)
                    longest, used = run.longest_length(min(args.lengths), budget)
                    limit = {"budget_bytes": budget, "longest_length": longest, "activation_bytes": used}
                    records.append({"kind": "scale_limit", "model": name, "processes": count, **limit, **settings})
                    measured(records)
                for length in sorted(args.lengths):
                    result = run.measure(length, args.repeats)
                    records.append({"kind": "scale", "model": name, "processes": count, "length": length, **result, **settings})
                    measured(records)
                del run
                gc.collect()
                release_freed_memory()  # the next group's processes need the room
            release_waiting(count, world, torch.device(args.device))
    return sorted(records, key=lambda record: (record["kind"], args.models.index(record["model"]), record["processes"]))


def release_waiting(count: int, world: int, device: torch.device) -> None:
    """The processes beyond the first ``count`` wait until those are done: a blocking receive from the
    first, which, unlike gloo's barrier, does not keep their cores busy while the others are timed."""
    if world == 1:
        return
    token = torch.zeros(1, device=device if device.type == "cuda" else "cpu")
    if dist.get_rank() == 0:
        for waiting in range(count, world):
            dist.send(token, waiting)
    elif dist.get_rank() >= count:
        dist.recv(token, 0)


def scale_tables(records: list[dict]) -> str:
    """The tables ``tokenmix bench --kinds scale`` prints: per step, and the longest lengths under the budget."""
    tables = []
    steps = [record for record in records if record["kind"] == "scale"]
    if steps:
        alone = {(r["model"], r["length"]): r for r in steps if r["processes"] == 1}
        rows = []
        for record in steps:
            base = alone.get((record["model"], record["length"]))
            rows.append(
                {
                    "model": record["model"],
                    "length": record["length"],
                    "processes": record["processes"],
                    "activation_MiB": record["activation_bytes"] / MIB,
                    "memory_vs_1": record["activation_bytes"] / base["activation_bytes"] if base else None,
                    "step_ms": record["step_ms"],
                    "time_vs_1": record["step_ms"] / base["step_ms"] if base else None,
                    "communication": record["communication_share"],
                    "exchanged_MiB": record["exchanged_bytes"] / MIB,
                }
            )
        tables.append(format_table(rows, list(rows[0])))
    limits = [record for record in records if record["kind"] == "scale_limit"]
    if limits:
        alone = {r["model"]: r for r in limits if r["processes"] == 1}
        rows = [
            {
                "model": record["model"],
                "processes": record["processes"],
                "budget_MiB": record["budget_bytes"] / MIB,
                "longest_length": record["longest_length"],
                "vs_1": record["longest_length"] / alone[record["model"]]["longest_length"] if record["model"] in alone else None,
            }
            for record in limits
        ]
        tables.append(format_table(rows, list(rows[0])))
    return "\n\n".join(tables)


def write_scale_plots(records: list[dict], directory) -> list[Path]:
    """``scale.png``: per model, activation memory and step time per process against the length, one line per P."""
    from .report import _against_length, _finish, _pyplot

    steps = [record for record in records if record["kind"] == "scale"]
    models = list(dict.fromkeys(record["model"] for record in steps))
    if not models:
        return []
    plt = _pyplot()
    figure, axes = plt.subplots(len(models), 2, figsize=(13, 3.8 * len(models)), squeeze=False, layout="constrained")
    for row, model in enumerate(models):
        for count in sorted({record["processes"] for record in steps if record["model"] == model}):
            series = sorted((r for r in steps if r["model"] == model and r["processes"] == count), key=lambda r: r["length"])
            lengths = [r["length"] for r in series]
            axes[row][0].plot(lengths, [r["activation_bytes"] / MIB for r in series], marker="o", label=f"P = {count}")
            axes[row][1].plot(lengths, [r["step_ms"] for r in series], marker="o", label=f"P = {count}")
        _against_length(axes[row][0], "activations per process (MiB)", f"{model}: memory")
        _against_length(axes[row][1], "training step (ms)", f"{model}: time")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [_finish(plt, figure, directory / "scale.png")]
