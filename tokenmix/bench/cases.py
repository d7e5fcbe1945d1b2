"""What a benchmark measures: a mixer, one residual block (layer) or a whole model.

A case builds its module and inputs; ``run(module, inputs)`` is the forward pass whose eval-mode
time and training-mode forward+backward time are measured. The generate kinds measure decoding:
``generate`` a causal LM model at position ``length`` (tokens: P prompt tokens and the next one),
``generate_mixer`` a Toeplitz mixer decoding ``length`` inputs one by one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..compilation import compile_blocks, compile_forward
from ..mixers.registry import build_mixer, list_mixers, mixer_class
from ..models.config import ModelConfig
from ..models.model import SequenceModel
from ..models.registry import list_models, model_spec, resolve_model
from ..ops.fused_toeplitz import KERNELS, check_fused_device
from ..ops.toeplitz import probe_fused_kernels
from ..precision import check_precision, compute_dtype

TRAINING_KINDS = ("mixer", "layer", "model")
KINDS = (*TRAINING_KINDS, "generate", "precision")  # what --kinds selects; generate: the generate and generate_mixer cases
CASE_KINDS = (*KINDS, "generate_mixer")
MIXER_KINDS = ("mixer", "generate_mixer", "precision")  # cases named by a mixer; the others by a model
GENERATE_KINDS = ("generate", "generate_mixer")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODEL_VOCAB = 256
MODEL_DEPTH = 2
GENERATE_DEPTH = 4
GENERATE_SEGMENT = 512  # the segment of recurrent (XL) models when decoding


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    causal: bool
    length: int
    dim: int
    batch: int
    dtype: str = "float32"
    device: str = "cpu"
    options: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)  # generate kinds: recompute_max, direct_max_seconds
    variant: str = ""  # a model changed by its options, named in its records beside the model's name: "ssm 16"
    precision: str = "fp32"  # the forward under autocast to this compute dtype (``tokenmix.precision``); mixers read inputs in it
    compile: bool = False  # the mixer, the layer or the model's blocks compiled (``tokenmix.compilation``)
    compile_mode: str = "default"  # torch.compile's mode
    depth: int | None = None  # a model's blocks (None: MODEL_DEPTH, GENERATE_DEPTH for decoding)
    kernels: str = "auto"  # the factored Toeplitz products' kernels: auto, torch or fused (``ops.fused_toeplitz``)

    @property
    def label(self) -> str:
        """The name its records show: the model's or mixer's, with the variant in brackets."""
        return f"{self.name} ({self.variant})" if self.variant else self.name

    def __post_init__(self):
        if self.kind not in CASE_KINDS:
            raise ValueError(f"kind must be one of {list(CASE_KINDS)}, got {self.kind!r}")
        names = list_mixers() if self.kind in MIXER_KINDS else list_models()
        if self.name not in names:
            raise ValueError(f"{self.kind} name must be one of {names}, got {self.name!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        check_precision(self.precision)
        if self.kind == "generate_mixer" and self.precision != "fp32":
            raise ValueError("a mixer's decoding is measured in its --dtype, not under a mixed --precision (the models' decoding is)")
        if self.compile and self.kind not in TRAINING_KINDS:
            raise ValueError(f"compile applies to the kinds {list(TRAINING_KINDS)}, not {self.kind!r} (decoding steps stay eager)")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {list(KERNELS)}, got {self.kernels!r}")
        if self.kernels == "fused":
            check_fused_device(self.device)

    def to_dict(self) -> dict:
        return asdict(self)

    def build(self) -> tuple[torch.nn.Module, torch.Tensor]:
        """(module on device, inputs); modules get the case's dtype, token inputs stay int64, a mixer's inputs come in
        the compute dtype of a mixed ``precision`` (as a layer under autocast hands them over). A model runs in the
        case's precision; the caller wraps the other kinds' calls in ``autocast``. Compiled when the case says so."""
        device, dtype = torch.device(self.device), DTYPES[self.dtype]
        torch.manual_seed(0)
        if self.kind in ("model", "generate"):
            task = "lm" if self.causal else "mlm"
            depth = self.depth or (GENERATE_DEPTH if self.kind == "generate" else MODEL_DEPTH)
            segments = {"segment_length": GENERATE_SEGMENT} if self.kind == "generate" else {}  # recurrent (XL) models decode in segments
            options = resolve_model(self.name, self.options, self.dim, depth, fallbacks=segments)
            module = SequenceModel(ModelConfig(self.name, task, MODEL_VOCAB, self.dim, depth, options=options))
            module.precision = self.precision
            length = self.length + (self.kind == "generate")  # generate: the prompt and the next token
            inputs = torch.randint(0, MODEL_VOCAB, (self.batch, length), device=device)
            if self.compile:
                probe_fused_kernels(device)
                compile_blocks(module, mode=self.compile_mode)
        else:
            if self.kind in MIXER_KINDS:
                module = build_mixer(self.name, self.dim, self.causal, **self.options)
            else:
                spec = model_spec(self.name)  # the top layer of a two-layer stack (fnet_ar_xl: its FNetAR layer)
                module = spec.layers(self.dim, self.causal, 2, resolve_model(self.name, self.options, self.dim, 2))[-1]
            inputs = torch.randn(self.batch, self.length, self.dim, device=device, dtype=dtype)
            if self.kind in ("mixer", "precision") and self.precision != "fp32":
                inputs = inputs.to(compute_dtype(self.precision))
            if self.compile:
                probe_fused_kernels(device)
                compile_forward(module, mode=self.compile_mode)
        return module.to(device=device, dtype=dtype), inputs

    @property
    def output_shape(self) -> tuple[int, ...]:
        width = MODEL_VOCAB if self.kind == "model" else self.dim
        return (self.batch, self.length, width)


def supports(kind: str, name: str, causal: bool) -> bool:
    """Whether the case exists (fnet is bidirectional only; XL models and fnet_ar causal only; decoding is
    causal; a mixer's decoding is measured against the direct product where it streams by its taps)."""
    if kind in GENERATE_KINDS and not causal:
        return False
    if kind == "generate_mixer":
        return mixer_class(name).toeplitz_streaming
    if kind in ("mixer", "precision"):
        return causal in mixer_class(name).causal_modes
    return ("lm" if causal else "mlm") in model_spec(name).tasks


def batch_for(length: int, batch_tokens: int) -> int:
    """batch = max(1, batch_tokens // length): the same tokens per step up to the longest lengths."""
    return max(1, batch_tokens // length)
