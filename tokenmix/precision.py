"""Mixed precision: a run's compute dtype, and where arithmetic stays in float32 regardless.

A run's ``precision`` ("fp32", "bf16" or "fp16") is a property of the run, not of a model's weights:
parameters and optimizer state stay float32, and the model's forward runs under ``torch.autocast``
to the compute dtype (``SequenceModel.precision``; ``autocast`` for any other module), so matrix
products and elementwise work run in half precision. Some arithmetic must not (``Mixer.inner_precision``):

- ``"float32"``: FFT products and kernels evaluated over long lags. bf16 holds integers exactly only
  up to 256 (an RPE fed lag 1000 would see 1000 rounded to 1000 +- 4), cuFFT's half precision takes
  power-of-two sizes only and a spectrum's dynamic range exceeds fp16's. Such a mixer runs with
  autocast off on its input cast to float32, and returns its output in the input's dtype.
- ``"input"``: autocast off, arithmetic in the input's dtype (kernels that take one dtype for all
  their operands, such as a depthwise convolution whose autocast would cast only some of them).
- ``"autocast"``: the caller's autocast applies (attention: its products in the compute dtype).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from pathlib import Path

import torch

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INNER_PRECISIONS = ("autocast", "input", "float32")
# The CPU instructions (Linux's /proc/cpuinfo flags) that compute each half precision natively; without them a CPU's
# matrix products in it are emulated, slower than in float32.
NATIVE_CPU_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
_CHECKED_CPU: set[str] = set()  # the precisions whose CPU instructions were looked up (outside torch.compile)


def check_precision(precision, argument: str = "precision") -> str:
    """``precision`` if it is one of ``PRECISIONS``; ValueError naming ``argument`` otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"{argument} must be one of {list(PRECISIONS)}, got {precision!r}")
    return precision


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype activations and matrix products run in under ``precision``."""
    return PRECISIONS[check_precision(precision)]


def autocast(precision: str, device, cache: bool = True) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``precision``'s compute dtype on ``device`` (a device, its name or a tensor
    on it); nothing for "fp32". Parameters keep their dtype: wrap a forward pass (and the loss), not
    the backward pass or the optimizer step. ``cache=False``: no cast of a weight is kept for reuse
    within the block (a CUDA graph's capture)."""
    check_precision(precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    device_type = device.device.type if isinstance(device, torch.Tensor) else torch.device(device).type
    if device_type == "cpu" and not torch.compiler.is_compiling() and precision not in _CHECKED_CPU:
        _CHECKED_CPU.add(precision)  # once per process: autocast is entered at every decoding step
        if emulated_on_this_cpu(precision):
            warnings.warn(
                f"{precision} on this CPU: it lacks {' and '.join(NATIVE_CPU_FLAGS[precision])}, so the matrix products run "
                "emulated, slower than in fp32 (mixed precision pays on GPUs and on CPUs with those instructions)",
                stacklevel=2,
            )
    return torch.autocast(device_type, dtype=PRECISIONS[precision], cache_enabled=cache)


@functools.cache
def emulated_on_this_cpu(precision: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU lacks every instruction set that computes ``precision`` natively (``NATIVE_CPU_FLAGS``); False
    where its flags cannot be read (no /proc/cpuinfo: not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), None)
    return flags is not None and not flags.intersection(NATIVE_CPU_FLAGS[precision])


def run_in_inner_precision(inner_precision: str, function, x: torch.Tensor, *args, **kwargs):
    """``function(x, *args, **kwargs)`` under ``inner_precision`` (module docstring) when autocast is on
    for x's device; the result (a tensor, or a tuple whose first element is one) in x's dtype."""
    device_type = x.device.type
    if inner_precision == "autocast" or not torch.is_autocast_enabled(device_type):
        return function(x, *args, **kwargs)
    with torch.autocast(device_type, enabled=False):
        inner = x.float() if inner_precision == "float32" and x.dtype in (torch.bfloat16, torch.float16) else x
        result = function(inner, *args, **kwargs)
    if isinstance(result, tuple):
        return (result[0].to(x.dtype), *result[1:])
    return result.to(x.dtype)


def without_autocast(method):
    """A custom autograd Function's ``forward`` or ``backward`` run with autocast off on its tensors' device: its
    arithmetic keeps the dtypes it chose, whatever autocast the caller (or a compiler tracing forward and backward
    together under the caller's autocast) has on."""

    @functools.wraps(method)
    def run(ctx, *args):
        device_type = next(arg.device.type for arg in args if isinstance(arg, torch.Tensor))
        with torch.autocast(device_type, enabled=False):
            return method(ctx, *args)

    return run
