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
  ``ops.toeplitz.fused_wanted``): one Triton kernel in which a program takes a row and a block of channels, writes
  x there and sums the row's live history, s <= t_b, in blocks, reading each input and tap once: O(t_b d) and no
  temporaries. The position is not advanced; the caller adds one after the step.

Every form reads and writes inputs in their own dtype (the stream's: float32, or float64), x cast to it.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from .fused_toeplitz import FP_FUSION, FUSED_EXTRA, check_fused_device

_BLOCK_LAGS, _BLOCK_CHANNELS = 64, 32  # a program's tile of history: 2048 inputs and taps (not tuned on a GPU yet)


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
    if fused:
        check_fused_device(inputs.device)
        return _history_op(inputs, position, x, taps)
    rows, capacity = inputs.shape[0], inputs.shape[1]
    inputs[torch.arange(rows, device=inputs.device), position] = x.to(inputs.dtype)
    lags = (position[:, None] - torch.arange(capacity, device=inputs.device)).clamp_(min=0)  # the inputs past t_b are zeros
    return (inputs * taps[lags]).sum(1)


@functools.cache
def _kernel():
    """The Triton kernel, defined (and triton imported) on first use."""
    try:
        import triton
        import triton.language as tl
    except ImportError as error:
        raise ImportError(FUSED_EXTRA) from error

    @triton.jit
    def history_step(
        inputs_ptr, position_ptr, x_ptr, taps_ptr, out_ptr,
        capacity, channels, row_stride, lag_stride, x_stride, taps_stride,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        """One row's block of channels: x written at t, then out = sum_{s <= t} taps[t - s] inputs[s] over blocks of s."""
        row = tl.program_id(0)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        t = tl.load(position_ptr + row)
        d_mask = d < tl.where(t < capacity, channels, 0)  # a position past the buffer (the caller's error): nothing touched
        history = inputs_ptr + row.to(tl.int64) * row_stride
        x = tl.load(x_ptr + row * x_stride + d, mask=d_mask, other=0.0).to(inputs_ptr.dtype.element_ty)
        tl.store(history + t * lag_stride + d, x, mask=d_mask)
        total = x * tl.load(taps_ptr + d, mask=d_mask, other=0.0)
        for start in range(0, t, BLOCK_S):  # s < t: the live history, nothing past it read
            s = start + tl.arange(0, BLOCK_S)
            mask = (s < t)[:, None] & d_mask[None, :]
            past = tl.load(history + s[:, None] * lag_stride + d[None, :], mask=mask, other=0.0)
            lag = tl.load(taps_ptr + (t - s)[:, None] * taps_stride + d[None, :], mask=mask, other=0.0)
            total += tl.sum(past * lag, axis=0)
        tl.store(out_ptr + row * channels + d, total, mask=d_mask)

    return triton, history_step


@torch.library.custom_op("tokenmix::history_product", mutates_args=("inputs",))
def _history_op(inputs: torch.Tensor, position: torch.Tensor, x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """The fused form as a custom operator: ``torch.compile`` keeps it whole in its graph (x written into ``inputs``)."""
    triton, kernel = _kernel()
    rows, capacity, channels = inputs.shape
    if inputs.stride(2) != 1:
        raise ValueError(f"inputs must be contiguous by channel (stride 1), got strides {inputs.stride()}")
    x, taps = x.contiguous(), taps.to(inputs.dtype).contiguous()
    out = inputs.new_empty(rows, channels)
    block_d = min(_BLOCK_CHANNELS, triton.next_power_of_2(channels))
    grid = (rows, triton.cdiv(channels, block_d))
    with torch.cuda.device(inputs.device) if inputs.is_cuda else contextlib.nullcontext():  # Triton launches on the current device
        kernel[grid](
            inputs, position, x, taps, out,
            capacity, channels, inputs.stride(0), inputs.stride(1), x.stride(0), taps.stride(0),
            BLOCK_S=_BLOCK_LAGS, BLOCK_D=block_d, enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
    return out


@_history_op.register_fake
def _(inputs, position, x, taps):
    return inputs.new_empty(inputs.shape[0], inputs.shape[2])
