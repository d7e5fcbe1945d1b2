"""Measure one case: median times, tokens/s, peak memory and the FFT floor, in one process.

CPU peak memory is the peak resident set size of a fresh process during one training step,
over its resident size just before it (``tokenmix.bench.worker`` runs each case in its own
process so measurements cannot pollute each other). CUDA uses ``max_memory_allocated``.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import asdict, dataclass

import torch

from ..ops.fft import fast_fft_size
from .cases import DTYPES, Case
from .timing import median_ms


@dataclass
class Measurement:
    kind: str
    mixer: str
    causal: bool
    length: int
    batch: int
    dim: int
    dtype: str
    device: str
    threads: int
    torch: str
    forward_ms: float
    forward_backward_ms: float
    tokens_per_s: float
    peak_mem_mb: float
    fft_floor_ms: float | None
    fwd_ratio_to_fft: float | None
    fwdbwd_ratio_to_fft: float | None

    def to_dict(self) -> dict:
        return asdict(self)


MEASUREMENT_FIELDS = tuple(Measurement.__dataclass_fields__)


def _resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_resident_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def fft_floor_ms(x: torch.Tensor, repeats: int) -> float:
    """A bare rfft + irfft round trip along the length of x (batch, length, channels), at N >= 2n."""
    n = x.shape[1]
    size = fast_fft_size(2 * n)

    def round_trip():
        with torch.no_grad():
            return torch.fft.irfft(torch.fft.rfft(x.float(), n=size, dim=1), n=size, dim=1)[:, :n]

    return median_ms(round_trip, x.device, repeats)


def measure(case: Case, repeats: int = 7) -> Measurement:
    module, inputs = case.build()
    device = inputs.device
    differentiable = inputs.is_floating_point()
    train_inputs = inputs.clone().requires_grad_(differentiable)
    parameters = [p for p in module.parameters() if p.requires_grad]
    targets = [train_inputs, *parameters] if differentiable else parameters
    module.train()
    output_grad = torch.randn(case.output_shape, device=device, dtype=DTYPES[case.dtype])

    def forward_backward():
        torch.autograd.grad(module(train_inputs), targets, output_grad)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        forward_backward()
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    else:
        before = _resident_mb()
        forward_backward()
        peak = max(0.0, _peak_resident_mb() - before)
    forward_backward_ms = median_ms(forward_backward, device, repeats)
    module.eval()

    def forward():
        with torch.no_grad():
            return module(inputs)

    forward_ms = median_ms(forward, device, repeats)
    floor = fft_floor_ms(inputs, repeats) if getattr(module, "fft_based", False) else None
    return Measurement(
        kind=case.kind,
        mixer=case.name,
        causal=case.causal,
        length=case.length,
        batch=case.batch,
        dim=case.dim,
        dtype=case.dtype,
        device=str(device),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        forward_ms=forward_ms,
        forward_backward_ms=forward_backward_ms,
        tokens_per_s=case.batch * case.length / (forward_backward_ms / 1e3),
        peak_mem_mb=peak,
        fft_floor_ms=floor,
        fwd_ratio_to_fft=forward_ms / floor if floor else None,
        fwdbwd_ratio_to_fft=forward_backward_ms / floor if floor else None,
    )
