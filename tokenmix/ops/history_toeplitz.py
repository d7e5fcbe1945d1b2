"""One token of a causal Toeplitz product over a history buffer: the step a CUDA graph replays in static decoding.

A stream in static buffers keeps its inputs so far in ``inputs`` (batch, C, d), row b's next position in
``position[b]`` (t_b < C). The step writes the new input x_b at t_b and returns, per channel,

    y_b = sum_{s <= t_b} taps[t_b - s] * inputs[b, s]

(TNN, Qin et al., arXiv 2305.04749, §3: the causal Toeplitz operator's row t_b; ``mixers/toeplitz_stream.py``). The
same kernels run at every position, the positions being read on the device, so that one captured graph serves
them all. Three forms, the same outputs:

- ``naive_history_product``: a Python loop over rows and lags (the definition; tests);
- PyTorch's (``kernels("torch")``): the taps gathered by lag for the whole buffer, O(C d) per row and token
  whatever t_b, in a few passes over (batch, C, d) temporaries;
- the fused one (``kernels("fused")``, or "auto" on CUDA where the fused kernels proved themselves,
  ``ops.toeplitz.fused_wanted``): one Triton kernel that reads only the live history, s <= t_b, each input and tap
  once: O(t_b d), no (batch, C, d) temporaries. A program takes a row, a block of channels and one of
  ``lag_splits`` equal parts of the row's history (so that a batch of one row still keeps the GPU busy), and sums
  its part in blocks of lags; the first part also writes x. The parts' sums are added after the kernel.

The position is not advanced; the caller adds one after the step.

Every form reads and writes inputs in their own dtype (the stream's: float32, or float64), x cast to it.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from .fused_toeplitz import FP_FUSION, check_fused_device, import_triton

_BLOCK_LAGS, _BLOCK_CHANNELS = 64, 32  # a program's tile of history: 2048 inputs and taps (not tuned on a GPU yet)
_PROGRAMS = 512  # programs a step aims at (about four per multiprocessor of an H100 or H200; not tuned on a GPU yet)


def naive_history_product(inputs: torch.Tensor, position: torch.Tensor, x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """The definition, row by row and lag by lag (inputs written in place)."""
    y = inputs.new_zeros(inputs.shape[0], inputs.shape[2])
    for b, t in enumerate(position.tolist()):
        inputs[b, t] = x[b].to(inputs.dtype)
        for s in range(t + 1):
            y[b] += taps[t - s] * inputs[b, s]
    return y


def history_product(inputs: torch.Tensor, position: torch.Tensor, x: torch.Tensor, taps: torch.Tensor, fused: bool) -> torch.Tensor:
    """Write x (batch, d) at each row's ``position`` of ``inputs`` (batch, C, d) and return y (batch, d), y_b the sum
    over s <= t_b of taps[t_b - s] inputs[b, s] (``taps`` (C, d) by lag); by the fused kernel when ``fused``."""
    _check_shapes(inputs, position, x, taps)
    if fused:
        check_fused_device(inputs.device)
        return _history_op(inputs, position, x, taps)
    rows, capacity = inputs.shape[0], inputs.shape[1]
    inputs[torch.arange(rows, device=inputs.device), position] = x.to(inputs.dtype)
    lags = (position[:, None] - torch.arange(capacity, device=inputs.device)).clamp_(min=0)  # the inputs past t_b are zeros
    return (inputs * taps[lags]).sum(1)


def _check_shapes(inputs: torch.Tensor, position: torch.Tensor, x: torch.Tensor, taps: torch.Tensor) -> None:
    if inputs.dim() != 3 or inputs.stride(2) != 1:
        raise ValueError(f"inputs must be (batch, capacity, dim) with channels contiguous, got shape {tuple(inputs.shape)}")
    rows, capacity, channels = inputs.shape
    if position.shape != (rows,) or position.dtype != torch.long:
        raise ValueError(f"position must be ({rows},) int64, got {tuple(position.shape)} {position.dtype}")
    if x.shape != (rows, channels):
        raise ValueError(f"x must be ({rows}, {channels}), got {tuple(x.shape)}")
    if taps.dim() != 2 or taps.shape[0] < capacity or taps.shape[1] != channels:
        raise ValueError(f"taps must be (lags >= {capacity}, {channels}), got {tuple(taps.shape)}")


def lag_splits(rows: int, channels: int, capacity: int) -> int:
    """How many programs share a row's block of channels, each summing a part of its history (``_PROGRAMS`` programs
    in all where the capacity allows parts of ``4 * _BLOCK_LAGS`` lags or more): a batch of one row keeps many
    multiprocessors busy. It depends on the shapes alone, so a captured graph launches the same grid at every position."""
    blocks = rows * -(-channels // min(_BLOCK_CHANNELS, 1 << (channels - 1).bit_length()))
    return max(1, min(-(-capacity // (4 * _BLOCK_LAGS)), -(-_PROGRAMS // blocks)))


@functools.cache
def _kernel():
    """The Triton kernel, defined (and triton imported) on first use."""
    triton, tl = import_triton()

    @triton.jit
    def history_step(
        inputs_ptr, position_ptr, x_ptr, taps_ptr, partial_ptr,
        rows, capacity, channels, row_stride, lag_stride, x_stride, taps_stride,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        """One row's block of channels, one part of its history: partial = sum taps[t - s] inputs[s] over the part's s < t;
        the first part also writes x at t and adds taps[0] x. A position outside the buffer (a caller's error) reads
        and writes nothing of the buffer, and its parts are zeros."""
        row, part, parts = tl.program_id(0), tl.program_id(2), tl.num_programs(2)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        t = tl.load(position_ptr + row)
        live = tl.where(t >= 0, t < capacity, False)
        past_count = tl.where(live, t, 0)
        span = tl.cdiv(tl.cdiv(past_count, parts), BLOCK_S) * BLOCK_S
        begin, end = part * span, tl.minimum(part * span + span, past_count)
        history = inputs_ptr + row.to(tl.int64) * row_stride
        d_mask = d < channels
        own = d < tl.where(live, tl.where(part == 0, channels, 0), 0)  # the first part's channels of a live row
        x = tl.load(x_ptr + row * x_stride + d, mask=own, other=0.0).to(inputs_ptr.dtype.element_ty)
        tl.store(history + t * lag_stride + d, x, mask=own)
        total = x * tl.load(taps_ptr + d, mask=own, other=0.0)
        for start in range(begin, end, BLOCK_S):  # s < t: the live history, nothing past it read
            s = start + tl.arange(0, BLOCK_S)
            mask = (s < end)[:, None] & d_mask[None, :]
            past = tl.load(history + s[:, None] * lag_stride + d[None, :], mask=mask, other=0.0)
            lag = tl.load(taps_ptr + (t - s)[:, None] * taps_stride + d[None, :], mask=mask, other=0.0)
            total += tl.sum(past * lag, axis=0)
        tl.store(partial_ptr + (part * rows + row) * channels + d, total, mask=d_mask)

    return triton, history_step


@torch.library.custom_op("tokenmix::history_product", mutates_args=("inputs",))
def _history_op(inputs: torch.Tensor, position: torch.Tensor, x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """The fused form as a custom operator: ``torch.compile`` keeps it whole in its graph (x written into ``inputs``).
    The parts of each row's history (``lag_splits``) are summed after the kernel, in a fixed order."""
    triton, kernel = _kernel()
    rows, capacity, channels = inputs.shape
    position, x, taps = position.contiguous(), x.contiguous(), taps.to(inputs.dtype).contiguous()
    parts = lag_splits(rows, channels, capacity)
    partial = inputs.new_empty(parts, rows, channels)
    block_d = min(_BLOCK_CHANNELS, triton.next_power_of_2(channels))
    grid = (rows, triton.cdiv(channels, block_d), parts)
    with torch.cuda.device(inputs.device) if inputs.is_cuda else contextlib.nullcontext():  # Triton launches on the current device
        kernel[grid](
            inputs, position, x, taps, partial,
            rows, capacity, channels, inputs.stride(0), inputs.stride(1), x.stride(0), taps.stride(0),
            BLOCK_S=_BLOCK_LAGS, BLOCK_D=block_d, enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
    return partial[0] if parts == 1 else partial.sum(0)


@_history_op.register_fake
def _(inputs, position, x, taps):
    return inputs.new_empty(inputs.shape[0], inputs.shape[2])
