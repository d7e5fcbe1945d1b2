"""Scale-out on torch.distributed: context parallelism (a sequence split over processes).

``ContextShard`` names one process's contiguous part of the sequence; ``context_parallel_logits``
runs a model on it, each mixer split the way it declares (``Mixer.sequence_split``);
``context_parallel_problems`` says, before any work, why a model cannot be split.
"""

from .context import ContextParallel, ContextRun, context_parallel_logits, context_parallel_problems
from .shards import ContextShard, shard_bounds

__all__ = ["ContextParallel", "ContextRun", "ContextShard", "context_parallel_logits", "context_parallel_problems", "shard_bounds"]
