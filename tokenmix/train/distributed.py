"""torchrun integration: gloo on CPU, NCCL on CUDA; with context parallelism a 2-D ``DeviceMesh``
(data parallel x context parallel, torchtitan's layout) whose ``"cp"`` groups split each sequence;
FSDP shards parameters over every process (the dp x cp product), as DDP replicates them."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


@dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    context_parallel: int = 1
    context_group: object = None  # the ProcessGroup of the processes sharing this one's sequences
    context_rank: int = 0  # this process's shard of them
    data_rank: int = 0  # which batches this process reads: the same for every process of a context group
    shard_mesh: object = None  # a 1-D DeviceMesh of every process: what FSDP shards parameters over

    @property
    def data_parallel_size(self) -> int:
        """Groups reading different batches."""
        return self.world_size // self.context_parallel

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_mean(self, value: float) -> float:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=_collective_device())
        dist.all_reduce(tensor)
        return float(tensor) / self.world_size

    def all_reduce_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks (the values themselves without DDP)."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def gather_objects(self, value) -> list:
        """``value`` from every rank, in rank order (a one-item list without DDP)."""
        if not self.enabled:
            return [value]
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.barrier()  # no rank tears down while another still talks to it
            dist.destroy_process_group()


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def launched_world_size() -> int:
    """The processes torchrun started (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_launch(context_parallel: int, fsdp: bool) -> None:
    """ValueError unless ``context_parallel`` processes per sequence fit the processes torchrun started,
    and ``fsdp`` has processes to shard over."""
    world_size = launched_world_size()
    if fsdp and world_size == 1:
        raise ValueError(
            "--fsdp shards the model over torchrun processes: start them with torchrun --standalone --nproc-per-node N "
            "-m tokenmix.cli train ..., or train in one process without it (--no-fsdp)"
        )
    if context_parallel > 1 and world_size == 1:
        raise ValueError(
            f"--context-parallel {context_parallel} splits each sequence over torchrun processes: start them with "
            f"torchrun --standalone --nproc-per-node {context_parallel} -m tokenmix.cli train ..."
        )
    if world_size % context_parallel:
        raise ValueError(
            f"--context-parallel {context_parallel} must divide the {world_size} processes torchrun started "
            "(the rest of the factor reads different batches: data parallel)"
        )


def init_distributed(device: torch.device, context_parallel: int = 1) -> DistributedContext:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); with ``context_parallel`` P > 1,
    ranks r and r' share sequences when r // P == r' // P (a ("dp", "cp") DeviceMesh)."""
    check_launch(context_parallel, fsdp=False)
    world_size = launched_world_size()
    if world_size == 1:
        return DistributedContext()
    backend = "nccl" if device.type == "cuda" else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} needs one GPU per process: local rank {local_rank}, "
                f"{torch.cuda.device_count()} GPU(s) visible; start fewer processes per node or use device 'cpu'"
            )
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend)
    shard_mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
    if context_parallel == 1:
        return DistributedContext(dist.get_rank(), world_size, local_rank, data_rank=dist.get_rank(), shard_mesh=shard_mesh)
    mesh = init_device_mesh(device.type, (world_size // context_parallel, context_parallel), mesh_dim_names=("dp", "cp"))
    return DistributedContext(
        dist.get_rank(),
        world_size,
        local_rank,
        context_parallel,
        mesh.get_group("cp"),
        mesh["cp"].get_local_rank(),
        mesh["dp"].get_local_rank(),
        shard_mesh,
    )
