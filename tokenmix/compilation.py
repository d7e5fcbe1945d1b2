"""Compiled blocks (``--compile``): ``torch.compile`` on each block's forward, as torchtitan compiles each
transformer block, so the launch-bound chain of small kernels between the FFTs and matmuls becomes a few
fused ones.

Only the blocks are compiled: the model's input checks (token ranges, mask shapes) read tensors on the host
and stay outside, at the model's boundary; a block's own checks are on shapes, which a graph keeps as guards.
Each block is captured whole (``fullgraph=True``: a graph break is an error, not a silent slowdown), forward
and backward. Hooks on a block (FSDP2's gathers, activation checkpointing) stay outside its graph: the
block's ``forward`` is compiled, not its call.

Lengths: the first length a block sees is compiled for that shape (what a fixed-length training run runs);
a second length recompiles once with the length symbolic, and that graph serves every later length whose
sizes it derives alike: the FFT size of a convolution is a power of two inside a graph
(``ops.fft.convolution_fft_size``), so one graph serves every length up to it. Operators defined on
the length's own grid compile once per grid: ``fd_tno`` per FFT size (its response is sampled on that grid)
and the 2-D mixers per grid width (``tno2d``, ``separable2d``). Streaming (``step``) stays eager.
"""

from __future__ import annotations

import torch
from torch import nn

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_compile_mode(mode: str) -> str:
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {list(COMPILE_MODES)}, got {mode!r}")
    return mode


def compile_forward(module: nn.Module, *, mode: str = "default", backend: str = "inductor") -> nn.Module:
    """Compile ``module``'s forward in place (whole: ``fullgraph=True``); its state dict, hooks and ``step`` stay as they were."""
    check_compile_mode(mode)
    module.forward = torch.compile(module.forward, fullgraph=True, backend=backend, mode=None if mode == "default" else mode)
    return module


def compile_blocks(model: nn.Module, *, mode: str = "default", backend: str = "inductor") -> None:
    """Compile every block of ``model`` (a ``SequenceModel``) in place (``compile_forward``)."""
    for block in model.blocks:
        compile_forward(block, mode=mode, backend=backend)
