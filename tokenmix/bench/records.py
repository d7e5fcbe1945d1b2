"""Measurement records: one dataclass per kind of case, all sharing the case's identity and provenance.

``Measurement``: speed and memory of training kinds (mixer, layer, model). ``GenerateMeasurement``:
decoding by a causal LM model at a position (kind ``generate``). ``MixerGenerateMeasurement``:
decoding a Toeplitz mixer token by token, tiled against the direct product (kind ``generate_mixer``).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields

import torch

from .cases import GENERATE_DEPTH, MODEL_DEPTH, Case


@dataclass(kw_only=True)
class Record:
    """What was measured, where, and from which source; ``error``: why it failed (every result then None)."""

    kind: str
    mixer: str  # the mixer's or model's name
    causal: bool
    length: int  # sequence length; for generate: the position P, for generate_mixer: the tokens decoded
    batch: int
    dim: int
    dtype: str
    device: str
    threads: int
    torch: str
    precision: str = "fp32"  # the compute dtype of the forward (autocast), records before it: fp32
    compiled: bool = False  # torch.compile'd (mixer, layer, a model's blocks)
    compile_mode: str | None = None  # torch.compile's mode when compiled
    depth: int | None = None  # a model's blocks (kinds model and generate)
    kernels: str = "auto"  # the factored Toeplitz products' kernels (--kernels: auto, torch, fused); records before it: auto
    retain_freed_memory: bool | None = None  # the allocator setting of the measuring process
    git_commit: str | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True)
class Measurement(Record):
    forward_ms: float | None
    forward_backward_ms: float | None
    tokens_per_s: float | None
    peak_mem_mb: float | None
    fft_floor_ms: float | None
    fft_channels_last_ms: float | None
    fft_channels_first_ms: float | None
    fwd_ratio_to_fft: float | None
    fwdbwd_ratio_to_fft: float | None
    profile: list[dict] | None = None  # with --profile: the operators taking most of a training step
    busy_ms: float | None = None  # with --profile on CUDA: the time a training step keeps the device busy (its kernels' time)


@dataclass(kw_only=True)
class GenerateMeasurement(Record):
    """A model's state built by one prefill call of P tokens, then single-token steps from it."""

    prefill_ms: float | None  # the one prefill call of P tokens
    step_ms: float | None  # median single-token step after warm-up
    state_bytes: int | None  # the state's size at P
    recompute_ms: float | None  # one forward over P + 1 tokens without a state (median); None when skipped
    recompute_ratio: float | None  # recompute_ms / step_ms
    recompute_skipped: bool | None  # P above --recompute-max
    # the median step at P over the median step at position REFERENCE_POSITION (or P if shorter), the two
    # timed alternately in one process, so that a load that changes over minutes does not enter the ratio
    step_ratio: float | None = None
    # models that decode from static buffers (``generation.graphs``): the median step of a StaticDecoder from the
    # same state, timed alternately with step_ms (on CUDA a CUDA graph's replay, elsewhere the static step run
    # eagerly), and step_ms / static_step_ms; None for the others
    static_step_ms: float | None = None
    static_speedup: float | None = None


@dataclass(kw_only=True)
class MixerGenerateMeasurement(Record):
    """L tokens decoded one by one: the tiled ``mixer.step`` against the direct product over the history."""

    tiled_s: float | None
    direct_s: float | None  # the time of the direct_tokens tokens done (all L when direct_finished)
    direct_tokens: int | None
    direct_finished: bool | None  # False: stopped at --direct-max-seconds
    direct_ratio: float | None  # direct_s / tiled_s, when the direct run finished
    max_abs_diff: float | None  # the two paths' outputs compared at the end of every window both timed
    tiled_curve: list[dict] | None  # per-token time in windows: [{"from", "to", "ms_per_token"}]
    direct_curve: list[dict] | None


@dataclass(kw_only=True)
class PrecisionMeasurement(Record):
    """A mixer under autocast to ``precision`` against its float64 self on the same input (``bench.accuracy``)."""

    output_error: float | None  # relative l2
    input_grad_error: float | None
    parameter_grad_error: float | None  # the worst parameter's; None for a mixer without parameters


RECORD_TYPES = {"generate": GenerateMeasurement, "generate_mixer": MixerGenerateMeasurement, "precision": PrecisionMeasurement}
IDENTITY_FIELDS = tuple(f.name for f in fields(Record) if f.default is MISSING)
MEASUREMENT_FIELDS = tuple(f.name for f in fields(Measurement))


def record_type(kind: str) -> type[Record]:
    return RECORD_TYPES.get(kind, Measurement)


def from_dict(data: dict) -> Record:
    """The record a worker printed as JSON."""
    return record_type(data["kind"])(**data)


def identity(case: Case, device=None) -> dict:
    """The identity fields of ``case``'s record (``device``: the device it ran on)."""
    return dict(
        kind=case.kind, mixer=case.label, causal=case.causal, length=case.length, batch=case.batch, dim=case.dim,
        dtype=case.dtype, device=str(device or case.device), threads=torch.get_num_threads(), torch=torch.__version__,
        precision=case.precision, compiled=case.compile, compile_mode=case.compile_mode if case.compile else None, kernels=case.kernels,
        depth=(case.depth or (GENERATE_DEPTH if case.kind == "generate" else MODEL_DEPTH)) if case.kind in ("model", "generate") else None,
    )  # fmt: skip


def failed_measurement(case: Case, error: str) -> Record:
    """The record of a case that could not be measured: its identity, no results, the reason."""
    cls = record_type(case.kind)
    results = {f.name: None for f in fields(cls) if f.default is MISSING and f.name not in IDENTITY_FIELDS}
    return cls(**identity(case), **results, error=error)
