"""Transformer-XL's relative multi-head attention (Dai et al. 2019, §3.3), the mixer of its blocks.

Queries are the newest n tokens; keys and values a context (batch, M + n, d) ending with them (a
block's memory, then the segment); the scores add a learned content bias u and a relative term
through sinusoidal encodings R of the distance, (q_i + v) . W_R R_{M+i-j} (``ops.attention.relative_attention``).
As a mixer on its own (name ``relative_attention``) the context is the sequence itself, and a
stream keeps every input as its context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..fields import Integer, Number, setting
from ..ops.attention import relative_attention
from ..options import Options
from ..state import StreamState
from .attention import default_heads, linear_in_dtype
from .base import PADDING_SIDES, Mixer
from .registry import register_mixer


def sinusoid_positions(count: int, dim: int, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(count, dim) sinusoidal encodings of distances 0 .. count - 1 (Vaswani et al.), in float64 for
    float64, else computed in float32 and given in ``dtype``."""
    computed = torch.promote_types(dtype, torch.float32)
    distances = torch.arange(count, device=device, dtype=computed)[:, None]
    frequencies = torch.exp(torch.arange(0, dim, 2, device=device, dtype=computed) * (-math.log(10000.0) / dim))
    encoding = torch.zeros(count, dim, device=device, dtype=computed)
    encoding[:, 0::2] = torch.sin(distances * frequencies)
    encoding[:, 1::2] = torch.cos(distances * frequencies)[:, : dim // 2]
    return encoding.to(dtype)


@dataclass
class ContextState(StreamState):
    """Every input of the stream so far (batch, t, dim), which of them are real tokens (batch, t), and the position."""

    inputs: torch.Tensor
    real: torch.Tensor
    position: int = 0


@dataclass
class RelativeAttentionOptions(Options):
    heads: int | None = setting(None, Integer(1, optional=True), "attention heads; none: the most up to 4 that split dim evenly")
    dropout: float = setting(0.0, Number(0, 1, open_maximum=True), "on the attention weights (a block passes its own dropout on)")

    def pinned(self, dim: int) -> RelativeAttentionOptions:
        return replace(self, heads=default_heads(dim, "none") if self.heads is None else self.heads)


@register_mixer("relative_attention")
class RelativeAttention(Mixer):
    """Causal multi-head attention with relative positions over a context (name ``relative_attention``);
    ``heads`` None takes ``default_heads``: 4 when dim allows it."""

    options_type = RelativeAttentionOptions
    causal_modes = (True,)
    mixes_context = True
    padding_invariant_sides = PADDING_SIDES  # scores depend on distances only
    no_weight_decay = ("content_bias", "position_bias")
    sequence_split = None  # not yet: its queries' positions would need the shard's offset

    def __init__(self, dim: int, causal: bool = True, options: RelativeAttentionOptions | None = None):
        if not causal:
            raise ValueError("relative_attention is causal (Transformer-XL): build it with causal=True")
        super().__init__(dim, causal, options)
        heads = self.options.heads
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads, self.head_dim = heads, dim // heads
        self.query = nn.Linear(dim, dim)
        self.key_value = nn.Linear(dim, 2 * dim)
        self.position = nn.Linear(dim, dim, bias=False)
        self.content_bias = nn.Parameter(torch.zeros(heads, self.head_dim))  # u
        self.position_bias = nn.Parameter(torch.zeros(heads, self.head_dim))  # v
        self.out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(self.options.dropout)

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        return self.mix_context(x, x, real, 0)

    def mix_context(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor, start: int) -> torch.Tensor:
        """x: the newest n inputs (batch, n, d); context: [memory; segment] ending with x; key_mask:
        (batch, M + n), True at keys that may be seen (each query always sees itself). Relative
        positions make ``start`` irrelevant."""
        batch, n, dim = x.shape
        total = context.shape[1]
        q = linear_in_dtype(x, self.query).view(batch, n, self.heads, self.head_dim)
        k, v = linear_in_dtype(context, self.key_value).view(batch, total, 2, self.heads, self.head_dim).unbind(2)
        r = linear_in_dtype(sinusoid_positions(total, dim, x.device, x.dtype), self.position).view(total, self.heads, self.head_dim)
        mixed = relative_attention(q, k, v, r, self.content_bias, self.position_bias, key_mask, self.dropout)
        return linear_in_dtype(mixed.reshape(batch, n, dim), self.out)

    static_context = True

    def mix_static_context(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``mix_context``: relative positions need no stream position."""
        return self.mix_context(x, context, key_mask, 0)

    state_type = ContextState

    def empty_state(self, batch_size: int, device, dtype: torch.dtype, max_length: int | None) -> ContextState:
        inputs = torch.zeros(batch_size, 0, self.dim, device=device, dtype=dtype)
        return ContextState(inputs, torch.zeros(batch_size, 0, dtype=torch.bool, device=device))

    def step_chunk(self, x: torch.Tensor, state: ContextState, mask) -> tuple[torch.Tensor, ContextState]:
        """The chunk over every earlier input and itself: the state grows with the stream."""
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        context, key_mask = torch.cat([state.inputs, x], dim=1), torch.cat([state.real, real], dim=1)
        return self.mix_context(x, context, key_mask, state.position), ContextState(context, key_mask, state.position + x.shape[1])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}"
