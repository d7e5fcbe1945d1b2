"""torchrun integration: gloo on CPU, NCCL on CUDA."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

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


def init_distributed(device: torch.device) -> DistributedContext:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
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
    return DistributedContext(dist.get_rank(), world_size, local_rank)
