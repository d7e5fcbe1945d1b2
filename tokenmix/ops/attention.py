"""Softmax attention, full or within non-overlapping chunks (MEGA §3.3; TCNCA, Terzić et al. 2023, §2, Fig. 1d).

Chunked attention splits the length into blocks of c tokens and lets each query see only the keys
of its own block (and only earlier ones when causal): O(n c) instead of O(n^2). Any length works:
the last block is padded and its padding masked (the public MEGA fails unless c divides n).
Scores are q.k / sqrt(e) plus an optional relative bias. Bidirectional, a query sees the real keys
of its block (all keys where the block has none); causal, it may always see itself too: a query with
no visible real key has a finite, ignored output instead of NaN. Blocks are folded into the batch
and a bidirectional key mask stays one row per block, so PyTorch's fused kernels apply and no
(n, n) score matrix is kept for backward (O(n) memory for full attention over 16k tokens).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .second_order import double_backward_enabled

RelativeBias = Callable[[int], torch.Tensor]  # size s -> (s, s) additive bias b[i - j]


def rotary(x: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) of positions offset .. offset + n - 1 on x (..., n, e), e even.

    Pairs (x_2i, x_2i+1) turn by angle t * 10000^(-2i/e), so q_s . k_t depends on s - t only.
    """
    n, e = x.shape[-2], x.shape[-1]
    if e % 2:
        raise ValueError(f"rotary positions need an even head width, got {e}")
    frequencies = torch.exp(torch.arange(0, e, 2, device=x.device, dtype=torch.float32) * (-math.log(10000.0) / e))
    positions = torch.arange(offset, offset + n, device=x.device, dtype=torch.float64)
    angles = (positions[:, None] * frequencies.double()).float()
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def block_size(n: int, chunk_size: int | None) -> int:
    """Tokens per attention block: n for full attention, else min(chunk_size, n)."""
    return n if chunk_size is None else min(chunk_size, n)


def chunked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk_size: int | None,
    causal: bool,
    key_mask: torch.Tensor | None = None,
    bias: RelativeBias | None = None,
) -> torch.Tensor:
    """Attention within blocks of ``chunk_size`` (None: one block, full attention).

    q, k: (batch, heads, n, e); v: (batch, heads, n, h); key_mask: (batch, n) bool, True at real
    tokens; bias: relative bias function. Returns (batch, heads, n, h).
    """
    batch, n = q.shape[0], q.shape[-2]
    size = block_size(n, chunk_size)
    blocks = -(-n // size)
    pad = blocks * size - n
    q, k, v = (F.pad(t, (0, 0, 0, pad)).unflatten(-2, (blocks, size)) for t in (q, k, v))  # (b, H, blocks, c, .)
    allowed = None
    if key_mask is not None or (pad and not causal):
        real = torch.ones(batch, n, dtype=torch.bool, device=q.device) if key_mask is None else key_mask
        real = F.pad(real, (0, pad), value=False).view(batch, blocks, 1, 1, size)
        if causal:
            earlier = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
            allowed = (real | torch.eye(size, dtype=torch.bool, device=q.device)) & earlier
        else:
            allowed = real | ~real.any(-1, keepdim=True)  # a block of padding sees all of itself
    attn_mask, is_causal = allowed, causal and allowed is None
    if bias is not None:
        attn_mask = bias(size).to(q.dtype)
        if allowed is not None or causal:
            visible = allowed if allowed is not None else torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
            attn_mask = attn_mask.masked_fill(~visible, float("-inf"))
        is_causal = False
    if attn_mask is not None and attn_mask.dim() == 5:  # (batch, blocks, 1, ., size): one mask per folded block
        attn_mask = attn_mask.flatten(0, 1)
    with sdpa_kernel(SDPBackend.MATH) if double_backward_enabled() else contextlib.nullcontext():  # the one kernel differentiable twice
        out = F.scaled_dot_product_attention(*(_fold_blocks(t) for t in (q, k, v)), attn_mask=attn_mask, is_causal=is_causal)
    return out.unflatten(0, (batch, blocks)).transpose(1, 2).flatten(-3, -2)[..., :n, :]


def _fold_blocks(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, blocks, c, e) -> (batch * blocks, heads, c, e): the 4-D layout the fused kernels take."""
    return x.transpose(1, 2).flatten(0, 1)


def chunk_mask(n: int, chunk_size: int | None, causal: bool) -> torch.Tensor:
    """(n, n) bool: query i may see key j (same block; j <= i when causal). Tests only."""
    size = block_size(n, chunk_size)
    positions = torch.arange(n)
    allowed = (positions[:, None] // size) == (positions[None, :] // size)
    return allowed & (positions[None, :] <= positions[:, None]) if causal else allowed


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Reference: explicit softmax(q k^T / sqrt(e) + bias) over the keys ``allowed`` marks (tests only)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v
