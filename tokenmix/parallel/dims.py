"""``ParallelDims``: how a run's processes divide the work, and the ``DeviceMesh`` they form.

With context parallelism P the processes form a 2-D mesh (data parallel x context parallel,
torchtitan's layout; consecutive ranks share sequences) whose ``"cp"`` groups split each sequence;
FSDP shards parameters over a 1-D mesh of every process (the dp x cp product), as DDP replicates
them. Without torchrun a run is one process and every collective is the value itself."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .distributed import (
    DEFAULT_COLLECTIVE_TIMEOUT,
    check_launch,
    collective_device,
    collective_faults,
    join_process_group,
    launched_world_size,
)


@dataclass
class ParallelDims:
    """The processes of a run: ``world_size`` of them, ``cp`` sharing each sequence (context parallel), the
    rest reading different batches (``dp`` groups). ``mesh``: the ("dp", "cp") DeviceMesh when ``cp`` > 1;
    ``shard_mesh``: the 1-D mesh of every process that FSDP shards over (None in one process); ``device``:
    this process's (torchrun: one GPU per process)."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    cp: int = 1
    data_rank: int = 0  # which batches this process reads: the same for every process of a context group
    context_rank: int = 0  # this process's shard of the sequences its context group shares
    mesh: DeviceMesh | None = None
    shard_mesh: DeviceMesh | None = None
    timeout: float = DEFAULT_COLLECTIVE_TIMEOUT  # seconds any collective waits for the other processes
    device: torch.device = torch.device("cpu")  # this process's

    @property
    def dp(self) -> int:
        """Groups reading different batches."""
        return self.world_size // self.cp

    @property
    def context_group(self):
        """The ProcessGroup of the processes sharing this one's sequences (None without context parallelism)."""
        return None if self.mesh is None else self.mesh.get_group("cp")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_mean(self, value: float) -> float:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=collective_device())
        dist.all_reduce(tensor)
        return float(tensor) / self.world_size

    def all_reduce_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks (the values themselves in one process)."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def agree(self, *flags: bool) -> list[bool]:
        """The flags OR-ed over ranks, so every rank saves and stops together."""
        if not self.enabled:
            return list(flags)
        return [value > 0 for value in self.all_reduce_max([float(flag) for flag in flags])]

    def gather_objects(self, value) -> list:
        """``value`` from every rank, in rank order (a one-item list in one process)."""
        if not self.enabled:
            return [value]
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def barrier(self, waiting_for: str = "the other processes") -> None:
        """Wait for every process; a MachineFault naming ``waiting_for`` when one does not come in time.
        On gloo a monitored barrier: rank 0 names the ranks that did not arrive."""
        if not self.enabled:
            return
        with self.faults(waiting_for):
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=self.timeout), wait_all_ranks=True)
            else:
                dist.barrier()

    def faults(self, waiting_for: str):
        """Turn a collective's failure inside (a timeout, a peer that died) into a MachineFault in one line."""
        return collective_faults(self.rank, self.world_size, self.timeout, waiting_for)

    def close(self, wait: bool = True) -> None:
        """Leave the process group; ``wait``: first for every process (no rank tears down while another still
        talks to it). A process leaving on an error does not wait: torchrun then stops the others."""
        if self.enabled and dist.is_initialized():
            if wait:
                self.barrier("the other processes to finish")
            dist.destroy_process_group()


def init_distributed(device: torch.device, context_parallel: int = 1, timeout: float = DEFAULT_COLLECTIVE_TIMEOUT) -> ParallelDims:
    """The run's ``ParallelDims``: join the process group when launched by torchrun (WORLD_SIZE > 1), every
    collective waiting at most ``timeout`` seconds; with ``context_parallel`` P > 1, ranks r and r' share
    sequences when r // P == r' // P (a ("dp", "cp") DeviceMesh)."""
    check_launch(context_parallel, fsdp=False)
    world_size, cp = launched_world_size(), context_parallel
    if world_size == 1:
        return ParallelDims(device=device)
    with collective_faults(int(os.environ.get("RANK", "0")), world_size, timeout, "the other processes to start"):
        local_rank = join_process_group(device, world_size, timeout)
        shard_mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
        rank = dist.get_rank()
        if cp == 1:
            return ParallelDims(world_size, rank, local_rank, data_rank=rank, shard_mesh=shard_mesh, timeout=timeout, device=device)
        mesh = init_device_mesh(device.type, (world_size // cp, cp), mesh_dim_names=("dp", "cp"))
    data_rank, context_rank = mesh["dp"].get_local_rank(), mesh["cp"].get_local_rank()
    return ParallelDims(world_size, rank, local_rank, cp, data_rank, context_rank, mesh, shard_mesh, timeout, device)
