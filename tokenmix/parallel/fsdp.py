"""FSDP2: a model's parameters, gradients and optimizer state sharded over the processes of a mesh.

Each block is one ``fully_shard`` unit (its weights gathered just before it runs and freed after),
the model the root unit holding the embedding (tied with the output layer) and the final norm:
torchtitan's layout. Gradients are averaged over the mesh, as DDP averages them, so a step is the
same whether parameters are replicated or sharded. Parameters become ``DTensor``s: the helpers below
read them as a whole or as this process's shard.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from ..models.model import SequenceModel


def shard_model(model: SequenceModel, mesh) -> None:
    """Shard ``model``'s parameters over the 1-D ``mesh`` in place: one unit per block, the root the rest.
    A block's ``step`` (segment-recurrent training) gathers its weights as its ``forward`` does."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
        register_fsdp_forward_method(block, "step")
    fully_shard(model, mesh=mesh)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a sharded parameter (the tensor itself when it is not sharded)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_state_dict(model: SequenceModel) -> dict[str, torch.Tensor]:
    """Every weight of ``model``, whole and on the CPU (all processes call it; the first receives it, the others nothing)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
