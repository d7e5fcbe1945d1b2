"""torchrun integration: gloo on CPU, NCCL on CUDA; with context parallelism a 2-D ``DeviceMesh``
(data parallel x context parallel, torchtitan's layout) whose ``"cp"`` groups split each sequence;
FSDP shards parameters over every process (the dp x cp product), as DDP replicates them.

Every collective has a timeout (``collective_timeout`` seconds): a process whose peers died or hang
stops with one line naming its rank and what it waited for, instead of waiting forever."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ..errors import MachineFault

COLLECTIVE_FAILURE = re.compile(r"[Tt]imed out|monitoredBarrier|Connection (closed|reset|refused)|NCCL (error|communicator)")
DEFAULT_COLLECTIVE_TIMEOUT = 1800.0  # seconds: gloo's own default; a step, an evaluation or a save must take less


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
    timeout: float = DEFAULT_COLLECTIVE_TIMEOUT  # seconds any collective waits for the other processes

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


@contextlib.contextmanager
def collective_faults(rank: int, world_size: int, timeout: float, waiting_for: str):
    """A collective's failure inside (a timeout, a peer that died) as a MachineFault naming ``rank`` and
    ``waiting_for``, in one line; other errors pass."""
    try:
        yield
    except RuntimeError as error:  # gloo's timeouts and lost peers are plain RuntimeErrors
        if not (isinstance(error, dist.DistError) or COLLECTIVE_FAILURE.search(str(error))):
            raise
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise MachineFault(
            f"rank {rank} of {world_size} stopped waiting for {waiting_for} (collective timeout {timeout:g} s): "
            f"another process died or hangs; its output says why. {detail[:300]}"
        ) from None


def attempt_store(timeout: float) -> dist.Store:
    """torchrun's key-value store (``env://``) under a prefix of this attempt (``TORCHELASTIC_RESTART_COUNT``):
    after ``--max-restarts`` restarts the workers, the addresses the killed attempt's processes published
    are not read as the new ones' (seen: connections refused, or a join that never ended)."""
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout)))
    return dist.PrefixStore(f"tokenmix/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


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


def init_distributed(device: torch.device, context_parallel: int = 1, timeout: float = DEFAULT_COLLECTIVE_TIMEOUT) -> DistributedContext:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), every collective waiting at most
    ``timeout`` seconds; with ``context_parallel`` P > 1, ranks r and r' share sequences when r // P == r' // P
    (a ("dp", "cp") DeviceMesh)."""
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
    with collective_faults(int(os.environ.get("RANK", "0")), world_size, timeout, "the other processes to start"):
        dist.init_process_group(
            backend, store=attempt_store(timeout), rank=int(os.environ["RANK"]), world_size=world_size, timeout=timedelta(seconds=timeout)
        )
        rank = dist.get_rank()
        shard_mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
        if context_parallel == 1:
            return DistributedContext(rank, world_size, local_rank, data_rank=rank, shard_mesh=shard_mesh, timeout=timeout)
        mesh = init_device_mesh(device.type, (world_size // context_parallel, context_parallel), mesh_dim_names=("dp", "cp"))
    cp, dp = mesh["cp"].get_local_rank(), mesh["dp"].get_local_rank()
    return DistributedContext(rank, world_size, local_rank, context_parallel, mesh.get_group("cp"), cp, dp, shard_mesh, timeout)
