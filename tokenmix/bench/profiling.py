"""Where a training step's time goes (``tokenmix bench --profile``): torch.profiler's operators, ranked.

On the CPU the operators' self time is the step's work. On CUDA the work is the device's: the kernels
(and copies) each operator launched, ranked by their device time; their sum over the step is the time the
device was busy, which against the step's wall time says how launch-bound the step is (an idle device
waits on the host). An operator's own CUDA-side device time would count its kernels twice.
"""

from __future__ import annotations

import re

import torch
from torch.autograd import DeviceType

from .timing import sync

PROFILE_ROWS = 12
NAMED_RANGE = "tokenmix::"  # tokenmix's own named ranges, listed wherever their time ranks (CPU profiles)


def profile_step(function, device: torch.device, steps: int = 3) -> tuple[list[dict], float | None]:
    """The operators (CPU) or kernels (CUDA) with the most self time in ``function`` (a training step), per step
    (op, self_ms, share), and on CUDA the device's busy time per step, all its kernels' (else None). torch.profiler
    records ``steps`` calls after two unrecorded warm-up calls under the profiler (its own allocations would otherwise
    land in the first recorded steps). On the CPU the blocked transposes into the FFTs' layout show as
    ``tokenmix::channels_first``."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=2, active=steps)) as profiler:
        for _ in range(1 + 2 + steps):
            function()
            sync(device)
            profiler.step()
    rows, busy_ms = ranked_work(profiler.key_averages(), device.type == "cuda", steps)
    return rows, busy_ms if device.type == "cuda" else None


def ranked_work(events, on_device: bool, steps: int) -> tuple[list[dict], float]:
    """``profile_step``'s rows and their total time per step from torch.profiler's averaged ``events``: on the CPU
    the operators by self time; ``on_device``, the device's own events (kernels, copies; not the spans named ranges
    leave on it) by device time, the templated variants of a kernel summed under its name."""
    self_us: dict[str, float] = {}
    for event in events:
        if not on_device:
            self_us[event.key] = event.self_cpu_time_total
        elif event.device_type != DeviceType.CPU and not event.is_user_annotation:
            name = kernel_name(event.key)
            self_us[name] = self_us.get(name, 0.0) + event.self_device_time_total
    total = sum(self_us.values())
    ranked = sorted(self_us.items(), key=lambda item: item[1], reverse=True)
    top = ranked[:PROFILE_ROWS] + [item for item in ranked[PROFILE_ROWS:] if item[0].startswith(NAMED_RANGE)]
    return [{"op": name, "self_ms": us / 1e3 / steps, "share": us / (total or 1.0)} for name, us in top], total / 1e3 / steps


def kernel_name(key: str) -> str:
    """A kernel's name without its template and argument lists, anonymous namespaces and return type:
    ``void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, ...)`` is
    ``at::native::vectorized_layer_norm_kernel``; a name that is no C++ signature (``Memcpy DtoD (Device -> Device)``)
    keeps its words."""
    name = key.removeprefix("void ").replace("(anonymous namespace)::", "")
    while (stripped := re.sub(r"<[^<>]*>", "", name)) != name:  # innermost template lists first
        name = stripped
    name = name.split("(", 1)[0].strip()
    last = name.split()[-1] if name else ""
    return (last if "::" in last else name) or key
