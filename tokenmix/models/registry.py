"""Model names -> layer stacks, their default options and the tasks they support."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..blocks import MegaBlock, TnnBlock, fnet_ar_xl_layers, tcnca_simple_block, transformer_block, xl_layers
from .config import TASKS


def repeated(block: Callable[..., nn.Module]) -> Callable[..., list[nn.Module]]:
    """A layers factory stacking ``depth`` copies of one block type."""

    def layers(dim: int, causal: bool, depth: int, **options) -> list[nn.Module]:
        return [block(dim, causal, **options) for _ in range(depth)]

    return layers


@dataclass(frozen=True)
class ModelSpec:
    layers: Callable[..., list[nn.Module]]  # (dim, causal, depth, **options) -> blocks
    defaults: dict = field(default_factory=dict)
    description: str = ""
    tasks: tuple[str, ...] = TASKS


_MODELS: dict[str, ModelSpec] = {
    "tnn": ModelSpec(repeated(TnnBlock), {"mixer": "tno"}, "Toeplitz neural network (paper 002): GTU(TNO) + GLU blocks"),
    "ski_tnn": ModelSpec(repeated(TnnBlock), {"mixer": "ski_tno"}, "TNN with the sparse + low-rank SKI-TNO (paper 000, Algorithm 1)"),
    "fd_tnn": ModelSpec(repeated(TnnBlock), {"mixer": "fd_tno"}, "TNN with the frequency-domain FD-TNO (paper 000, Algorithm 2)"),
    "mega": ModelSpec(repeated(MegaBlock), {"sequence_mixer": "ema"}, "MEGA: damped EMA + gated single-head chunked attention"),
    "tcnca": ModelSpec(
        repeated(MegaBlock), {"sequence_mixer": "tcn"}, "TCNCA (paper 004): the MEGA block with a dilated TCN instead of the EMA"
    ),
    "tcnca_simple": ModelSpec(
        repeated(tcnca_simple_block), {}, "TCNCA-simple (paper 004, App. C): pre-norm TCN -> chunked attention -> MLP"
    ),
    "transformer": ModelSpec(repeated(transformer_block), {}, "pre-norm Transformer: full multi-head attention (rotary) + FFN"),
    "transformer_xl": ModelSpec(xl_layers, {}, "Transformer-XL: relative attention over [memory; segment]", ("lm",)),
    "fnet_ar_xl": ModelSpec(
        fnet_ar_xl_layers, {}, "Transformer-XL with half its attention layers replaced by FNetAR mixing (paper 003)", ("lm",)
    ),
}


def list_models() -> list[str]:
    return sorted(_MODELS)


def model_spec(name: str) -> ModelSpec:
    if name not in _MODELS:
        raise ValueError(f"name must be one of {list_models()}, got {name!r}")
    return _MODELS[name]
