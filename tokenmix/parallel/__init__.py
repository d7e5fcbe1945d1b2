"""Scale-out on torch.distributed: a model made ready to train over a run's processes.

``dims.init_distributed`` joins torchrun's processes (``distributed.py``) and returns their
``ParallelDims`` (the DeviceMesh of data parallel x context parallel); ``parallelize.parallelize``
applies, in torchtitan's order, context parallelism, activation checkpointing, compile and FSDP2
(``fsdp.py``) or DDP. Context parallelism splits a sequence over
processes: ``ContextShard`` names one process's contiguous part of it; ``context_parallel_logits``
runs a model on it, each mixer split the way it declares (``Mixer.sequence_split``);
``context_parallel_problems`` says, before any work, why a model cannot be split.
"""

from .context import ContextParallel, ContextRun, context_parallel_logits, context_parallel_problems
from .shards import ContextShard, shard_bounds

__all__ = ["ContextParallel", "ContextRun", "ContextShard", "context_parallel_logits", "context_parallel_problems", "shard_bounds"]
