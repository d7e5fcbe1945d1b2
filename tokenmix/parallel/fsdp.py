"""FSDP2: a model's parameters, gradients and optimizer state sharded over the processes of a mesh.

Each block is one ``fully_shard`` unit (its weights gathered just before it runs and freed after),
the model the root unit holding the embedding (tied with the output layer) and the final norm:
torchtitan's layout. Gradients are averaged over the mesh, as DDP averages them, so a step is the
same whether parameters are replicated or sharded. Parameters become ``DTensor``s: the helpers below
read them as a whole or as this process's shard. ``torch.distributed``'s FSDP, DTensor and checkpoint modules
take about a second to import: the functions import them, so a process that shards nothing does not wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..mixers.base import Mixer
from ..models.model import SequenceModel
from ..precision import compute_dtype

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy


def shard_model(model: SequenceModel, mesh, precision: str = "fp32") -> None:
    """Shard ``model``'s parameters over the 1-D ``mesh`` in place: one unit per block, the root the rest.
    A block's ``step`` (segment-recurrent training) gathers its weights as its ``forward`` does.

    In mixed ``precision`` (torchtitan's policy) the units gather their parameters in the compute dtype and
    reduce gradients in float32. What computes in float32 under autocast keeps float32 parameters, each a unit
    of its own: the layer norms (autocast runs them in float32) and the mixers whose ``inner_precision`` is
    "float32" (FFT products, kernels over long lags).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    policy = mixed_precision_policy(precision)
    if precision != "fp32":
        for module in float32_modules(model):
            fully_shard(module, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
        register_fsdp_forward_method(block, "step")
    fully_shard(model, mesh=mesh, mp_policy=policy)


def float32_modules(model: nn.Module) -> list[nn.Module]:
    """The outermost modules with parameters that compute in float32 under autocast (layer norms, mixers of
    ``inner_precision`` "float32"), innermost first (the order nested FSDP units are made in)."""
    found: list[nn.Module] = []
    for module in model.modules():
        computes_in_float32 = isinstance(module, nn.LayerNorm) or (isinstance(module, Mixer) and module.inner_precision == "float32")
        inside = any(module is not outer and any(module is m for m in outer.modules()) for outer in found)
        if computes_in_float32 and not inside and any(True for _ in module.parameters()):
            found.append(module)
    return found[::-1]


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's policy for ``precision``: parameters gathered in its compute dtype, gradients reduced in float32,
    the model's outputs in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute_dtype(precision), reduce_dtype=torch.float32, output_dtype=torch.float32)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a sharded parameter (the tensor itself when it is not sharded)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_state_dict(model: SequenceModel) -> dict[str, torch.Tensor]:
    """Every weight of ``model``, whole and on the CPU (all processes call it; the first receives it, the others nothing)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
