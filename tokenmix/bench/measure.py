"""Measure one case: median times, tokens/s, peak memory and the FFT floor, in one process
(the generate kinds: ``tokenmix.bench.generate``).

CPU peak memory is the peak resident set size of a fresh process during one training step,
over its resident size just before it (``tokenmix.bench.worker`` runs each case in its own
process so measurements cannot pollute each other). CUDA uses ``max_memory_allocated``.

The FFT floor of an FFT-based mixer is the fastest bare ``rfft`` + ``irfft`` round trip of the
same data at the same FFT size N >= 2n, over the two layouts the data can be transformed in:
along dim 1 of the (batch, length, channels) tensor as given (strided), and along the last dim of
a contiguous channels-first copy (the copy not timed). Both are recorded; the floor is the minimum,
so no mixer can honestly run below it.
"""

from __future__ import annotations

import os
import resource
import sys

import torch

from ..ops.fft import fast_fft_size
from .cases import DTYPES, Case
from .generate import measure_generate, measure_generate_mixer
from .records import Measurement, Record, identity
from .timing import median_ms, sync

FLOOR_FIELDS = ("fft_channels_last_ms", "fft_channels_first_ms", "fft_floor_ms")


def _resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_resident_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def fft_floor_ms(x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Bare rfft + irfft round trips of x (batch, length, channels) along its length at N >= 2n.

    Returns the channels-last time (along dim 1, as x lies), the channels-first time (along the
    last dim of a contiguous transposed copy) and the floor, their minimum.
    """
    n = x.shape[1]
    size = fast_fft_size(2 * n)
    channels_last = x.float()
    channels_first = channels_last.transpose(1, 2).contiguous()

    def round_trip(data: torch.Tensor, dim: int):
        def run():
            with torch.no_grad():
                return torch.fft.irfft(torch.fft.rfft(data, n=size, dim=dim), n=size, dim=dim).narrow(dim, 0, n)

        return run

    last = median_ms(round_trip(channels_last, 1), x.device, repeats)
    first = median_ms(round_trip(channels_first, -1), x.device, repeats)
    return {"fft_channels_last_ms": last, "fft_channels_first_ms": first, "fft_floor_ms": min(last, first)}


PROFILE_ROWS = 12


def profile_step(function, device: torch.device, steps: int = 3) -> list[dict]:
    """The operators with the most self time in ``function`` (a training step), per step: op, self_ms, share.

    torch.profiler records ``steps`` calls after two unrecorded warm-up calls under the profiler
    (its own allocations would otherwise land in the first recorded steps). CPU self time on CPU,
    device self time on CUDA. Work done in helper threads shows as the self time of the operator
    that waits for it (``tokenmix::channels_first``).
    """
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=2, active=steps)) as profiler:
        for _ in range(1 + 2 + steps):
            function()
            sync(device)
            profiler.step()
    events = profiler.key_averages()
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    total = sum(getattr(event, attribute) for event in events) or 1.0
    top = sorted(events, key=lambda event: getattr(event, attribute), reverse=True)[:PROFILE_ROWS]
    return [{"op": e.key, "self_ms": getattr(e, attribute) / 1e3 / steps, "share": getattr(e, attribute) / total} for e in top]


def measure(case: Case, repeats: int = 7, profile: bool = False) -> Record:
    """The case's record: a ``Measurement`` of the training kinds (``profile``: with its operators), else
    the generate kinds' (see ``tokenmix.bench.generate``)."""
    if case.kind == "generate":
        return measure_generate(case, repeats)
    if case.kind == "generate_mixer":
        return measure_generate_mixer(case)
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
    operators = profile_step(forward_backward, device) if profile else None
    module.eval()

    def forward():
        with torch.no_grad():
            return module(inputs)

    forward_ms = median_ms(forward, device, repeats)
    floors = fft_floor_ms(inputs, repeats) if getattr(module, "fft_based", False) else dict.fromkeys(FLOOR_FIELDS)
    floor = floors["fft_floor_ms"]
    return Measurement(
        **identity(case, device),
        forward_ms=forward_ms,
        forward_backward_ms=forward_backward_ms,
        tokens_per_s=case.batch * case.length / (forward_backward_ms / 1e3),
        peak_mem_mb=peak,
        **floors,
        fwd_ratio_to_fft=forward_ms / floor if floor else None,
        fwdbwd_ratio_to_fft=forward_backward_ms / floor if floor else None,
        profile=operators,
    )
