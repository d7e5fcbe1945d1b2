"""Model names -> layer stacks, their default options and the tasks they support."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..blocks import FourierXlStack, MegaBlock, TcncaSimpleBlock, TnnBlock, TransformerBlock, XlBlock
from ..mixers.parts import leaf_names
from ..options import Options, refuse_unknown
from ..registry import Registry

TASKS = ("lm", "mlm", "classify")


class Repeated:
    """A stack of ``depth`` copies of one block type."""

    def __init__(self, block: type[nn.Module]):
        self.block = block

    def __call__(self, dim: int, causal: bool, depth: int, options: Options) -> list[nn.Module]:
        """``depth`` blocks, each built from the resolved ``options`` (``resolve_layers``)."""
        return [self.block(dim, causal, options) for _ in range(depth)]

    def resolve_layers(self, options: dict, dim: int, depth: int) -> tuple[Options, dict]:
        return self.block.resolve_options(options, dim)

    @property
    def options_type(self):
        return self.block.options_type

    def parts(self):
        return self.block.parts()


@dataclass(frozen=True)
class ModelSpec:
    layers: Repeated | FourierXlStack  # resolve_layers(options, dim, depth) -> (tree, unknown); (dim, causal, depth, tree) -> blocks
    defaults: dict = field(default_factory=dict)
    description: str = ""
    tasks: tuple[str, ...] = TASKS


_MODELS: Registry[ModelSpec] = Registry(
    "name",
    {
        "tnn": ModelSpec(Repeated(TnnBlock), {"mixer": "tno"}, "Toeplitz neural network: GTU(TNO) + GLU blocks"),
        "ski_tnn": ModelSpec(Repeated(TnnBlock), {"mixer": "ski_tno"}, "TNN with the sparse + low-rank SKI-TNO"),
        "fd_tnn": ModelSpec(Repeated(TnnBlock), {"mixer": "fd_tno"}, "TNN with the frequency-domain FD-TNO"),
        "tnn2d": ModelSpec(
            Repeated(TnnBlock), {"mixer": "tno2d"}, "TNN on a 2-D token grid: GTU(TNO 2-D) + GLU blocks (option grid)", ("mlm", "classify")
        ),
        "mega": ModelSpec(Repeated(MegaBlock), {"sequence_mixer": "ema"}, "MEGA: damped EMA + gated single-head chunked attention"),
        "tcnca": ModelSpec(Repeated(MegaBlock), {"sequence_mixer": "tcn"}, "TCNCA: the MEGA block with a dilated TCN instead of the EMA"),
        "tcnca_simple": ModelSpec(Repeated(TcncaSimpleBlock), {}, "TCNCA-simple: pre-norm TCN -> chunked attention -> MLP"),
        "transformer": ModelSpec(Repeated(TransformerBlock), {}, "pre-norm Transformer: full multi-head attention (rotary) + FFN"),
        "transformer_xl": ModelSpec(
            Repeated(XlBlock), {"mixer": "relative_attention"}, "Transformer-XL: relative attention over [memory; segment]", ("lm",)
        ),
        "fnet_ar_xl": ModelSpec(FourierXlStack(), {}, "Transformer-XL with half its attention layers replaced by FNetAR mixing", ("lm",)),
    },
)


def list_models() -> list[str]:
    return _MODELS.names()


def model_spec(name: str) -> ModelSpec:
    return _MODELS[name]


def resolve_model(name: str, options: dict, dim: int, depth: int, fallbacks: dict | None = None) -> Options:
    """The options of the blocks of model ``name`` (width ``dim``, ``depth`` layers) from flat, dotted or
    nested ``options``: its blocks' options dataclass, each mixer they build in its ``parts``, every default
    filled in (``mixers/parts.py``); ValueError on unknown names. ``fallbacks``: flat options that apply
    where the model has an option of that name and ``options`` do not set it, and are dropped elsewhere (a
    run's ``grid`` and ``segment_length``)."""
    spec = model_spec(name)
    given = {**spec.defaults, **options}
    resolved, unknown = spec.layers.resolve_layers({**(fallbacks or {}), **given}, dim, depth)
    refuse_unknown({key: value for key, value in unknown.items() if key in given}, leaf_names(resolved.as_dict()), f"model {name!r}")
    return resolved


def resolve_model_options(name: str, options: dict, dim: int, depth: int) -> dict:
    """Every option of the blocks of model ``name`` and, nested under their keys, of the mixers they build,
    defaults filled in, as a saved config holds them (``resolve_model``)."""
    return resolve_model(name, options, dim, depth).as_dict()
