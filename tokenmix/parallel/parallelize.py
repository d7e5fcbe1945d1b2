"""``parallelize``: a model made ready to train over a run's processes, in torchtitan's order.

1. context parallelism: each sequence split over the ``cp`` processes of a group (``context.py``);
2. activation checkpointing: each block's activations recomputed in the backward pass;
3. compile: each block's forward through ``torch.compile`` (``tokenmix.compilation``);
4. FSDP2 with its mixed-precision policy (``fsdp.py``), or else DDP over every process.

Each step is a plain function of the model and the run's ``ParallelDims``. Compiling before sharding
keeps FSDP's gathers outside the compiled graphs (hooks on a block are not part of its forward).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..compilation import compile_blocks
from ..models.model import SequenceModel
from ..ops.toeplitz import probe_fused_kernels
from .context import ContextParallel
from .dims import ParallelDims
from .fsdp import shard_model


@dataclass(frozen=True)
class ParallelConfig:
    """How a run spreads and speeds up its model (``TrainConfig``'s fields of the same names)."""

    activation_checkpointing: bool = False
    compile: bool = False
    fsdp: bool = False
    precision: str = "fp32"  # FSDP2 gathers parameters in its compute dtype


@dataclass
class ParallelModel:
    """A model made ready by ``parallelize``: ``model`` itself (its parameters sharded in place with FSDP),
    ``split`` the model on this process's shard of each sequence (None without context parallelism),
    ``trained`` what a training step runs (the DDP wrapper, the split or the model) and ``evaluated`` what
    evaluation runs (the model, or split as in training with every logit gathered)."""

    model: SequenceModel
    split: ContextParallel | None
    trained: nn.Module
    evaluated: nn.Module

    def drop_ddp(self) -> None:
        """Free the DDP wrapper now, if there is one. It sits in reference cycles, so dropping the reference is not
        enough: collect it. Only then: a full collection in a long-lived process (a notebook, a test session)
        takes about a second."""
        if isinstance(self.trained, torch.nn.parallel.DistributedDataParallel):
            self.trained = self.split or self.model
            gc.collect()


def apply_context_parallel(model: SequenceModel, dims: ParallelDims) -> tuple[ContextParallel | None, nn.Module]:
    """(split, evaluated): ``model`` on this process's shard of each sequence, and what evaluation runs; Transformer-XL
    streams are evaluated whole in each process. (None, model) without context parallelism."""
    if dims.cp == 1:
        return None, model
    group, rank, size = dims.context_group, dims.context_rank, dims.cp
    split = ContextParallel(model, group, rank, size)
    return split, model if model.recurrent else ContextParallel(model, group, rank, size, gather=True)


def apply_activation_checkpointing(model: SequenceModel, enabled: bool) -> None:
    """Blocks recompute their activations in the backward pass instead of keeping them (``enabled``)."""
    model.activation_checkpointing = enabled


def apply_compile(model: SequenceModel) -> None:
    """Each block's forward compiled (``compile_blocks``), the fused Toeplitz kernels probed first; the model's input
    checks stay eager."""
    probe_fused_kernels(next(model.parameters()).device)
    compile_blocks(model)


def apply_fsdp(model: SequenceModel, dims: ParallelDims, precision: str) -> None:
    """The model's parameters, gradients and optimizer state sharded over every process (``shard_model``)."""
    shard_model(model, dims.shard_mesh, precision)


def apply_ddp(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` replicated on every process, its gradients averaged over them."""
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)


def parallelize(
    model: SequenceModel,
    dims: ParallelDims,
    config: ParallelConfig,
    before_wrapping: Callable[[ContextParallel | None], None] | None = None,
) -> ParallelModel:
    """``model`` (on ``dims.device``) made ready to train over ``dims``: split, checkpointed, compiled, then sharded or
    replicated (the module docstring). ``before_wrapping(split)`` runs while the model is still eager and whole,
    before compile and FSDP or DDP change it: what a caller measures of a training step (its memory) and checks
    last belongs there."""
    split, evaluated = apply_context_parallel(model, dims)
    apply_activation_checkpointing(model, config.activation_checkpointing)
    if before_wrapping is not None:
        before_wrapping(split)
    if config.compile:
        apply_compile(model)
    trained: nn.Module = model
    if config.fsdp:
        apply_fsdp(model, dims, config.precision)
        trained = split or model
    elif dims.enabled:
        trained = apply_ddp(split or model, dims.device)
    return ParallelModel(model, split, trained, evaluated)
