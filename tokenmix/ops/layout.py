"""Channels-first copies for FFTs along the length: (batch, length, d) -> contiguous (batch, d, N).

Module boundaries are (batch, length, channels), but an FFT along the length runs fastest on
contiguous rows, so the FFT mixers transpose (and zero-pad to the FFT size N) first. On CPU,
PyTorch's generic strided copy does that transposition more slowly than its blocked 2-D transpose
(used when a whole transposed matrix is copied into a contiguous one), so ``channels_first`` cuts x
into token blocks, transposes each block into a small buffer that stays in cache, and copies the
buffer's rows into place (not inside ``torch.compile``, whose graph would fix every loop bound). It
does so in the caller's thread: torch ops run from other live threads give each of them an OpenMP
team of its own, and once a process holds more OpenMP threads than CPUs, libgomp stops spinning
between parallel regions, which made every later small operation 3-5x slower (a 16-row linear layer:
14 -> 50-80 us with 2 threads on 2 cores, after one TNN forward over 4224 tokens; the serve engine
and batched decoding ran that way). Other devices, and small tensors, take the plain copy, which is
also the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

TOKEN_BLOCK = 256  # tokens per transposed block (measured best of 64-512 at 1536 channels)
MIN_BLOCKED_ELEMENTS = 1 << 20  # below this the plain copy is as fast


def naive_channels_first(x: torch.Tensor, length: int) -> torch.Tensor:
    """Reference: x (batch, n, d) transposed to (batch, d, n) and zero-padded to ``length``, contiguous."""
    return F.pad(x.transpose(1, 2), (0, length - x.shape[1])).contiguous()


def channels_first(x: torch.Tensor, length: int) -> torch.Tensor:
    """x (batch, n, d) as a contiguous (batch, d, length) tensor: x transposed into [..., :n], zeros after.

    Not differentiable: for use inside autograd Functions.
    """
    batch, n, d = x.shape
    if length < n:
        raise ValueError(f"length must be >= the sequence length {n}, got {length}")
    plain = x.device.type != "cpu" or x.numel() < MIN_BLOCKED_ELEMENTS or torch.compiler.is_compiling()  # a loop would fix the shape
    if plain or x.transpose(1, 2).is_contiguous():
        return naive_channels_first(x, length)
    x = x.contiguous()
    out = x.new_empty(batch, d, length)
    out[..., n:].zero_()
    buffer = x.new_empty(d * TOKEN_BLOCK)
    with torch.profiler.record_function("tokenmix::channels_first"):
        for b in range(batch):
            for start in range(0, n, TOKEN_BLOCK):
                stop = min(start + TOKEN_BLOCK, n)
                block = buffer[: d * (stop - start)].view(d, stop - start)
                block.copy_(x[b, start:stop].t())  # a whole transposed matrix: PyTorch's blocked transpose
                out[b, :, start:stop].copy_(block)
    return out
