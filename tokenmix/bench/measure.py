"""Measure one case: median times, tokens/s, peak memory and the FFT floor, in one process
(the generate kinds: ``tokenmix.bench.generate``).

CPU peak memory is the peak resident set size (``VmHWM``) of a fresh process during one training step,
over its resident size just before it, to which the high-water mark is lowered first
(``tokenmix.bench.worker`` runs each case in its own process so measurements cannot pollute each other). CUDA uses ``max_memory_allocated``.

The FFT floor of an FFT-based mixer is the fastest bare float32 ``rfft`` + ``irfft`` round trip of the
same data at the same FFT size N >= 2n (whatever the case's precision: the mixers' FFTs run in float32),
over the two layouts the data can be transformed in:
along dim 1 of the (batch, length, channels) tensor as given (strided), and along the last dim of
a contiguous channels-first copy (the copy not timed). Both are recorded; the floor is the minimum,
so no mixer can honestly run below it. A 2-D mixer (``tno2d``) gets the 2-D round trip over its
row-major (H, W) grid at sizes >= (2H - 1, 2W - 1), in the same two layouts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops.fft import fast_fft_size
from ..ops.fused_toeplitz import kernels
from ..ops.toeplitz2d import fft_grid
from ..precision import autocast
from ..train.memory import reset_resident_peak, resident_peak
from .accuracy import measure_precision
from .cases import DTYPES, Case
from .generate import measure_generate, measure_generate_mixer
from .profiling import profile_step
from .records import Measurement, Record, identity
from .timing import median_ms

FLOOR_FIELDS = ("fft_channels_last_ms", "fft_channels_first_ms", "fft_floor_ms")


def fft_floor_ms(x: torch.Tensor, repeats: int, grid: tuple[int, int] | None = None) -> dict[str, float]:
    """Bare real FFT round trips of x (batch, length, channels) at the sizes the mixer uses: along the
    length at N >= 2n or, with ``grid`` (H, W) of a 2-D mixer, over the row-major grid at sizes >= (2H - 1, 2W - 1).

    Returns the channels-last time (x as it lies), the channels-first time (a contiguous copy with the
    channels before the transformed dims) and the floor, their minimum.
    """
    if grid is None:
        sizes, dims, channels_last = [fast_fft_size(2 * x.shape[1])], 1, x.float()
    else:
        padded = F.pad(x.float(), (0, 0, 0, grid[0] * grid[1] - x.shape[1]))
        sizes, dims, channels_last = list(fft_grid(grid)), 2, padded.reshape(x.shape[0], *grid, x.shape[2])
    channels_first = channels_last.movedim(-1, 1).contiguous()

    def round_trip(data: torch.Tensor, transformed: list[int]):
        def run():
            with torch.no_grad():
                return torch.fft.irfftn(torch.fft.rfftn(data, s=sizes, dim=transformed), s=sizes, dim=transformed)

        return run

    last = median_ms(round_trip(channels_last, list(range(1, 1 + dims))), x.device, repeats)
    first = median_ms(round_trip(channels_first, list(range(-dims, 0))), x.device, repeats)
    return {"fft_channels_last_ms": last, "fft_channels_first_ms": first, "fft_floor_ms": min(last, first)}


def measure(case: Case, repeats: int = 7, profile: bool = False) -> Record:
    """The case's record: a ``Measurement`` of the training kinds (``profile``: with its operators), else
    the generate kinds' (see ``tokenmix.bench.generate``) or the precision kind's (``tokenmix.bench.accuracy``);
    the factored Toeplitz products on the case's ``kernels`` (``ops.fused_toeplitz``)."""
    with kernels(case.kernels):
        if case.kind == "generate":
            return measure_generate(case, repeats)
        if case.kind == "generate_mixer":
            return measure_generate_mixer(case)
        if case.kind == "precision":
            return measure_precision(case)
        return measure_training(case, repeats, profile)


def measure_training(case: Case, repeats: int, profile: bool) -> Measurement:
    """A training kind's ``Measurement``: eval forward and training step times, peak memory, the FFT floor."""
    module, inputs = case.build()
    device = inputs.device
    differentiable = inputs.is_floating_point()
    train_inputs = inputs.clone().requires_grad_(differentiable)
    parameters = [p for p in module.parameters() if p.requires_grad]
    targets = [train_inputs, *parameters] if differentiable else parameters
    module.train()
    output_grad = torch.randn(case.output_shape, device=device, dtype=DTYPES[case.dtype])

    def run(x: torch.Tensor) -> torch.Tensor:
        with autocast(case.precision, device):
            return module(x)

    def forward_backward():
        output = run(train_inputs)
        torch.autograd.grad(output, targets, output_grad.to(output.dtype))

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        forward_backward()
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    else:
        reset_resident_peak()
        before = resident_peak()
        forward_backward()
        after = resident_peak()
        peak = None if None in (before, after) else (after - before) / 2**20
    forward_backward_ms = median_ms(forward_backward, device, repeats)
    operators, busy_ms = profile_step(forward_backward, device) if profile else (None, None)
    module.eval()

    def forward():
        with torch.no_grad():
            return run(inputs)

    forward_ms = median_ms(forward, device, repeats)
    grid = module.grid_for(case.length) if callable(getattr(module, "grid_for", None)) else None  # a 2-D mixer's grid
    floors = fft_floor_ms(inputs, repeats, grid) if getattr(module, "fft_based", False) else dict.fromkeys(FLOOR_FIELDS)
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
        busy_ms=busy_ms,
    )
