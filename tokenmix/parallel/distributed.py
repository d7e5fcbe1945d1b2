"""torchrun integration: joining the process group (gloo on CPU, NCCL on CUDA) from torchrun's
environment, and the launch a run's settings need.

Every collective has a timeout (``collective_timeout`` seconds): a process whose peers died or hang
stops with one line naming its rank and what it waited for, instead of waiting forever."""

from __future__ import annotations

import contextlib
import os
import re
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import MachineFault

COLLECTIVE_FAILURE = re.compile(r"[Tt]imed out|monitoredBarrier|Connection (closed|reset|refused)|NCCL (error|communicator)")
DEFAULT_COLLECTIVE_TIMEOUT = 1800.0  # seconds: gloo's own default; a step, an evaluation or a save must take less


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


def collective_device() -> torch.device:
    """Where the tensors of this process group's collectives live: the current GPU on NCCL, else the CPU."""
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


def join_process_group(device: torch.device, world_size: int, timeout: float) -> int:
    """Join torchrun's process group of ``world_size`` processes (NCCL with one GPU per process when ``device``
    is CUDA, gloo otherwise), every collective waiting at most ``timeout`` seconds; returns the local rank."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} needs one GPU per process: local rank {local_rank}, "
                f"{torch.cuda.device_count()} GPU(s) visible; start fewer processes per node or use device 'cpu'"
            )
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend, store=attempt_store(timeout), rank=int(os.environ["RANK"]), world_size=world_size, timeout=timedelta(seconds=timeout)
    )
    return local_rank
