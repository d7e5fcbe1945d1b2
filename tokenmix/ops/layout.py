"""Channels-first copies for FFTs along the length: (batch, length, d) -> contiguous (batch, d, N).

Module boundaries are (batch, length, channels), but an FFT along the length runs fastest on
contiguous rows, so the FFT mixers transpose (and zero-pad to the FFT size N) first. On CPU,
PyTorch's generic strided copy does that transposition at a few GB/s, as long as the FFT itself
at 8192 tokens. Its blocked 2-D transpose (used when a whole transposed matrix is copied into a
contiguous one) is about twice as fast, so ``channels_first`` cuts x into token blocks, transposes
each block into a small buffer that stays in cache, and copies the buffer's rows into place; the
blocks are shared among ``torch.get_num_threads()`` Python threads (torch releases the GIL in
copies). Other devices, and small tensors, take the plain copy, which is also the reference.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

TOKEN_BLOCK = 256  # tokens per transposed block (measured best of 64-512 at 1536 channels)
MIN_BLOCKED_ELEMENTS = 1 << 20  # below this the plain copy is as fast

_pool: list[ThreadPoolExecutor] = []


def _executor() -> ThreadPoolExecutor:
    if not _pool:
        _pool.append(ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="tokenmix-layout"))
    return _pool[0]


def _forget_pool_in_child() -> None:  # a forked child has none of the parent's threads
    _pool.clear()


os.register_at_fork(after_in_child=_forget_pool_in_child)


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
    if x.transpose(1, 2).is_contiguous() or x.device.type != "cpu" or x.numel() < MIN_BLOCKED_ELEMENTS:
        return naive_channels_first(x, length)
    x = x.contiguous()
    out = x.new_empty(batch, d, length)
    out[..., n:].zero_()
    blocks = [(b, start) for b in range(batch) for start in range(0, n, TOKEN_BLOCK)]
    workers = max(1, min(torch.get_num_threads(), len(blocks)))
    # One block buffer per worker, allocated here: memory a helper thread allocates comes from its
    # own malloc arena, which keeps it after use (+37 MB peak per TNO step at 4096 tokens, measured).
    buffers = [x.new_empty(d * TOKEN_BLOCK) for _ in range(workers)]

    inference = torch.is_inference_mode_enabled()

    def transpose_blocks(worker: int) -> None:
        # Grad and inference modes are per thread, and these threads start with neither: take the caller's.
        with torch.inference_mode(inference), torch.no_grad():
            for b, start in blocks[worker::workers]:
                stop = min(start + TOKEN_BLOCK, n)
                block = buffers[worker][: d * (stop - start)].view(d, stop - start)
                block.copy_(x[b, start:stop].t())  # a whole transposed matrix: PyTorch's blocked transpose
                out[b, :, start:stop].copy_(block)

    with torch.profiler.record_function("tokenmix::channels_first"):  # the helper threads' work, by name in profiles
        if workers == 1:
            transpose_blocks(0)
        else:
            list(_executor().map(transpose_blocks, range(workers)))
    return out
