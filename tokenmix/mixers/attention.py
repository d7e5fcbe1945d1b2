"""Softmax attention mixers, full and chunked (TCNCA, Terzić et al. 2023, §2 and Appendix C; MEGA §3.3).

``attention``: multi-head attention over the whole sequence. ``chunked_attention``: the same
within non-overlapping blocks of ``chunk_size`` tokens (O(n c)). Both take any length (the last
block is padded and masked, ``ops/attention.py``) and carry position by a relative scheme:
``position="rotary"`` (RoPE, as TCNCA on enwik8), ``"bias"`` (a learned scalar per offset, MEGA's
simple relative bias; offsets beyond ``max_distance`` share the last value) or ``"none"``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from ..fields import Choice, Integer, setting
from ..ops.attention import (
    AttentionCache,
    StaticAttentionCache,
    attention_block,
    cached_attention,
    chunked_attention,
    empty_cache,
    rotary,
    static_cache,
    static_cached_attention,
)
from ..options import Options
from ..validation import check_int
from .base import PADDING_SIDES, Mixer, zero_padding
from .registry import register_mixer

POSITIONS = ("rotary", "bias", "none")


class RelativePosition(nn.Module):
    """Position for attention: rotary on queries and keys, or a learned bias b[i - j] on scores."""

    def __init__(self, position: str = "rotary", max_distance: int = 1024):
        super().__init__()
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {list(POSITIONS)}, got {position!r}")
        self.position = position
        self.max_distance = check_int(max_distance, "max_distance")
        self.table = nn.Parameter(torch.randn(2 * max_distance - 1) * 0.02) if position == "bias" else None

    def rotate(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k of positions offset, offset + 1, ... rotated (rotary), else unchanged."""
        return (rotary(q, offset), rotary(k, offset)) if self.position == "rotary" else (q, k)

    def bias_between(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(queries, keys) bias b[i - j] between the query positions i and key positions j, the offset
        clamped to +-(max_distance - 1)."""
        offsets = (queries[:, None] - keys[None, :]).clamp(-(self.max_distance - 1), self.max_distance - 1)
        return self.table[offsets + self.max_distance - 1]

    def bias_function(self):
        """``bias_between`` for ``chunked_attention``, None without a learned bias."""
        return self.bias_between if self.table is not None else None

    def extra_repr(self) -> str:
        return f"position={self.position!r}" + (f", max_distance={self.max_distance}" if self.table is not None else "")


class AttentionCore:
    """Softmax attention of projected heads, the part every attention mixer and MEGA's gated attention share.

    ``core((q, k, v), mask)`` attends over the sequence (within chunks of ``chunk_size``, causal or
    not); ``core.step((q, k, v), cache, mask)`` attends the next tokens over the cache. q, k are
    (batch, heads, n, key_width), unrotated (``position`` rotates them, or adds its learned bias);
    v is (batch, heads, n, value_width)."""

    def __init__(self, position: RelativePosition, chunk_size: int | None, causal: bool, heads: int, key_width: int, value_width: int):
        self.position, self.chunk_size, self.causal = position, chunk_size, causal
        self.heads, self.key_width, self.value_width = heads, key_width, value_width

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """``chunk_padding_sides``."""
        return chunk_padding_sides(self.chunk_size)

    @property
    def front_padding_period(self) -> int:
        """Chunk boundaries count from the first token: padding by whole chunks keeps them (any padding without chunks)."""
        return self.chunk_size or 1

    sequence_axis = 2  # q, k and v are (batch, heads, n, width)

    @property
    def sequence_split(self) -> str:
        """Chunks by their halo (whole chunks), full attention by its heads (``Mixer.sequence_split``)."""
        return "heads" if self.chunk_size is None else "halo"

    def halo_span(self, start: int, stop: int, length: int) -> tuple[int, int]:
        """``chunk_span``."""
        return chunk_span(start, stop, length, self.chunk_size, self.causal)

    def __call__(self, qkv, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = qkv
        q, k = self.position.rotate(q, k)
        return chunked_attention(q, k, v, self.chunk_size, self.causal, mask, self.position.bias_function())

    def rotate(self, q: torch.Tensor, k: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k of positions offset, offset + 1, ... placed there (rotary), else unchanged."""
        return self.position.rotate(q, k, offset)

    def attend_block(self, qkv, query_start: int, key_start: int, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Full attention's queries at positions query_start, ... over its keys at key_start, ... alone (q and k
        ``rotate``d there): (out, lse) of ``ops.attention.attention_block``, a block of ring attention. ``mask``:
        the whole sequence's (batch, length) padding mask; bidirectional, a sequence of padding alone sees
        all of itself (as ``chunked_attention``)."""
        q, k, v = qkv
        queries = torch.arange(query_start, query_start + q.shape[-2], device=q.device)
        keys = torch.arange(key_start, key_start + k.shape[-2], device=q.device)
        visible = None if mask is None else mask[:, key_start : key_start + k.shape[-2]]
        if visible is not None and not self.causal:
            visible = visible | ~mask.any(dim=-1, keepdim=True)
        return attention_block(q, k, v, queries, keys, visible, self.causal, self.position.bias_function())

    def init_state(self, batch_size: int, *, max_length: int | None = None, device=None, dtype=None, masked: int = 0) -> AttentionCache:
        """An empty cache (``max_length`` unused: the cache grows, or empties at every chunk); after ``masked``
        padding positions, holding as many masked keys as stepping them keeps (those of the current chunk)."""
        check_int(masked, "masked", minimum=0)
        weight = self.position.table if self.position.table is not None else torch.empty(0)
        device, dtype = device or weight.device, dtype or weight.dtype
        kept = masked if self.chunk_size is None else masked % self.chunk_size
        return replace(empty_cache(batch_size, self.heads, self.key_width, self.value_width, device, dtype, kept), position=masked)

    def step(self, qkv, cache: AttentionCache, mask: torch.Tensor | None) -> tuple[torch.Tensor, AttentionCache]:
        return cached_attention(*qkv, cache, self.chunk_size, mask, self.position.rotate, self.position.bias_function())

    static_decoding = True

    def static_state(self, cache: AttentionCache, capacity: int) -> StaticAttentionCache:
        """The cache in a slot per position (full attention: ``capacity`` of them) or of the chunk (``Mixer.static_state``)."""
        return static_cache(cache, capacity if self.chunk_size is None else min(self.chunk_size, capacity))

    def static_step(self, qkv, cache: StaticAttentionCache) -> torch.Tensor:
        """``static_cached_attention`` of the next token (``Mixer.static_step``)."""
        return static_cached_attention(*qkv, cache, self.chunk_size, self.position.rotate, self.position.bias_function())


def chunk_padding_sides(chunk_size: int | None) -> tuple[str, ...]:
    """Full attention sees offsets only (both sides); chunks start at multiples of ``chunk_size`` from the first token (right only)."""
    return PADDING_SIDES if chunk_size is None else ("right",)


def chunk_span(start: int, stop: int, length: int, chunk_size: int, causal: bool) -> tuple[int, int]:
    """The tokens [begin, end) that chunked attention at [start, stop) reads: from the start of the chunk
    holding ``start`` (chunks start at multiples of ``chunk_size``) to ``stop`` (causal) or the end of the
    chunk holding ``stop - 1``."""
    end = stop if causal else min(length, -(-stop // chunk_size) * chunk_size)
    return start // chunk_size * chunk_size, end


def relative_reach(max_distance: int | None, chunk_size: int | None) -> int:
    """Offsets a learned position bias tells apart: ``max_distance``, else the chunk, else 1024."""
    return max_distance or chunk_size or 1024


def default_heads(dim: int, position: str) -> int:
    """The most heads, up to 4, that split ``dim`` evenly (into even widths for rotary positions)."""
    for heads in (4, 2, 1):
        width, remainder = divmod(dim, heads)
        if remainder == 0 and (position != "rotary" or width % 2 == 0):
            return heads
    raise ValueError(f"position='rotary' needs an even head width, impossible with dim={dim}; use position='bias' or 'none'")


@dataclass
class AttentionOptions(Options):
    heads: int | None = setting(
        None, Integer(1, optional=True), "attention heads; none: the most up to 4 that split dim evenly (into even widths for rotary)"
    )
    chunk_size: int | None = setting(None, Integer(1, optional=True), "attend within blocks of this many tokens (none: the whole sequence)")
    position: str = setting("rotary", Choice(POSITIONS), "rotary, bias (a learned scalar per offset) or none")
    max_distance: int | None = setting(
        None, Integer(1, optional=True), "offsets of the learned bias beyond this share one value (none: the chunk, else 1024)"
    )

    def pinned(self, dim: int) -> AttentionOptions:
        heads = default_heads(dim, self.position) if self.heads is None else self.heads
        return replace(self, heads=heads, max_distance=relative_reach(self.max_distance, self.chunk_size))


@register_mixer("attention")
class Attention(Mixer):
    """Multi-head softmax attention (name ``attention``); ``chunk_size`` None sees the whole sequence.

    ``heads`` None takes ``default_heads(dim, position)``: 4 when dim allows it. Projections run in
    the input's dtype, so a float32 module takes bfloat16 or float64 input like every other mixer.
    """

    options_type = AttentionOptions

    def __init__(self, dim: int, causal: bool = False, options: AttentionOptions | None = None):
        super().__init__(dim, causal, options)
        heads, chunk_size, position = self.options.heads, self.options.chunk_size, self.options.position
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        if position == "rotary" and (dim // heads) % 2:
            raise ValueError(f"position='rotary' needs an even head width dim / heads, got {dim} / {heads} = {dim // heads}")
        self.heads, self.chunk_size = heads, chunk_size
        self.query_key_value = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.position = RelativePosition(position, self.options.max_distance)
        width = dim // heads
        self.core = AttentionCore(self.position, chunk_size, causal, heads, width, width)

    @property
    def padding_invariant_sides(self) -> tuple[str, ...]:
        """Both sides for full attention, the right for chunked (``chunk_padding_sides``)."""
        return self.core.padding_invariant_sides

    @property
    def front_padding_period(self) -> int:
        """The core's: its chunk."""
        return self.core.front_padding_period

    @property
    def bounded_state(self) -> bool:
        """Chunked attention keeps the current chunk; full attention every key."""
        return self.chunk_size is not None

    @property
    def reach(self) -> tuple[int, int] | None:
        """Chunked: the rest of the chunk (before, and after unless causal); full attention: unbounded."""
        if self.chunk_size is None:
            return None
        return self.chunk_size - 1, 0 if self.causal else self.chunk_size - 1

    @property
    def sequence_split(self) -> str:
        """Chunks by their halo (whole chunks); full attention projects its shard and splits its core by heads."""
        return "body" if self.chunk_size is None else "halo"

    def halo_span(self, start: int, stop: int, length: int) -> tuple[int, int]:
        return self.core.halo_span(start, stop, length)

    def stream_parts(self) -> list:
        return [self.core]

    def body(self, x: torch.Tensor, mask: torch.Tensor | None, run) -> torch.Tensor:
        """``mix`` with the core run by ``run`` (context parallelism: over head shards)."""
        return self.merged(run(self.core, tuple(self.heads_of(zero_padding(x, mask)))))

    def heads_of(self, x: torch.Tensor) -> torch.Tensor:
        """(q, k, v) stacked: (3, batch, heads, n, dim / heads)."""
        batch, n, _ = x.shape
        return linear_in_dtype(x, self.query_key_value).view(batch, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)

    def merged(self, mixed: torch.Tensor) -> torch.Tensor:
        """(batch, heads, n, dim / heads) -> the output projection of the heads side by side."""
        batch, _, n, _ = mixed.shape
        return linear_in_dtype(mixed.transpose(1, 2).reshape(batch, n, self.dim), self.out)

    def mix(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.merged(self.core(self.heads_of(x), mask))

    state_type = AttentionCache

    def empty_state(self, batch_size: int, device, dtype: torch.dtype, max_length: int | None) -> AttentionCache:
        return self.core.init_state(batch_size, device=device, dtype=dtype)

    def after_padding(self, state: AttentionCache, padding: torch.Tensor) -> AttentionCache:
        return self.core.init_state(padding.shape[0], device=padding.device, dtype=state.keys.dtype, masked=padding.shape[1])

    def step_chunk(self, x: torch.Tensor, state: AttentionCache, mask) -> tuple[torch.Tensor, AttentionCache]:
        mixed, cache = self.core.step(self.heads_of(x), state, mask)
        return self.merged(mixed), cache

    static_decoding = True

    def static_state(self, state: AttentionCache, capacity: int) -> StaticAttentionCache:
        return self.core.static_state(state, capacity)

    def static_step(self, x: torch.Tensor, state: StaticAttentionCache) -> torch.Tensor:
        return self.merged(self.core.static_step(tuple(self.heads_of(x)), state))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, causal={self.causal}, heads={self.heads}, chunk_size={self.chunk_size}"


def linear_in_dtype(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)`` computed in x's dtype, whatever the layer's."""
    return F.linear(x, layer.weight.to(x.dtype), None if layer.bias is None else layer.bias.to(x.dtype))


@dataclass
class ChunkedAttentionOptions(AttentionOptions):
    chunk_size: int = setting(128, Integer(1), "attend within non-overlapping blocks of this many tokens (the last block is padded)")


@register_mixer("chunked_attention")
class ChunkedAttention(Attention):
    """Attention within blocks of ``chunk_size`` tokens (name ``chunked_attention``, default 128)."""

    options_type = ChunkedAttentionOptions
