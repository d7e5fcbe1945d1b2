"""Softmax attention, full or within non-overlapping chunks (MEGA §3.3; TCNCA, Terzić et al. 2023, §2, Fig. 1d).

Chunked attention splits the length into blocks of c tokens and lets each query see only the keys
of its own block (and only earlier ones when causal): O(n c) instead of O(n^2). Any length works:
the last block is padded and its padding masked (the public MEGA fails unless c divides n).
Scores are q.k / sqrt(e) plus an optional relative bias. Bidirectional, a query sees the real keys
of its block (all keys where the block has none); causal, it may always see itself too: a query with
no visible real key has a finite, ignored output instead of NaN. Blocks are folded into the batch
and a bidirectional key mask stays one row per block, so PyTorch's fused kernels apply and no
(n, n) score matrix is kept for backward (O(n) memory for full attention over 16k tokens).
A learned bias needs its gradient, which no fused kernel gives: biased scores are computed a tile of
queries at a time (at most ``max_scores`` of them at once) and, when training, recomputed tile by tile
in the backward pass (activation checkpointing), so MEGA's full attention over Path-X's 16k tokens
keeps O(n) too instead of a dense (n, n) bias, mask and probability matrix.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from ..state import StreamState
from .forms import OpForms, register_op, returned, token_by_token, without_state
from .second_order import double_backward_enabled

RelativeBias = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # positions i (q,), j (k,) -> (q, k) bias b[i - j]
MAX_SCORES = 1 << 24  # biased scores materialised at once: 64 MB in float32


def rotary(x: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) of positions offset .. offset + n - 1 on x (..., n, e), e even;
    ``offset`` an int, or a (batch,) tensor of each row's for x (batch, heads, n, e).

    Pairs (x_2i, x_2i+1) turn by angle t * 10000^(-2i/e), so q_s . k_t depends on s - t only, to the
    rounding of the angles: computed in float64, used in float32, or float64 for float64 x (a sequence split into shards at other
    offsets then scores the same to float64 rounding).
    """
    n, e = x.shape[-2], x.shape[-1]
    if e % 2:
        raise ValueError(f"rotary positions need an even head width, got {e}")
    frequencies = torch.exp(torch.arange(0, e, 2, device=x.device, dtype=torch.float64) * (-math.log(10000.0) / e))
    positions = torch.arange(n, device=x.device, dtype=torch.float64)
    positions = positions + (offset.to(x.device, torch.float64)[:, None, None] if isinstance(offset, torch.Tensor) else offset)
    angles = positions[..., None] * frequencies  # (n, e / 2), or (batch, 1, n, e / 2) for per-row offsets
    angles = angles if x.dtype == torch.float64 else angles.float()
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
    max_scores: int = MAX_SCORES,
) -> torch.Tensor:
    """Attention within blocks of ``chunk_size`` (None: one block, full attention).

    q, k: (batch, heads, n, e); v: (batch, heads, n, h); key_mask: (batch, n) bool, True at real
    tokens; bias: relative bias function; max_scores: the most biased scores held at once.
    Returns (batch, heads, n, h).
    """
    batch, n = q.shape[0], q.shape[-2]
    size = block_size(n, chunk_size)
    blocks = -(-n // size)
    pad = blocks * size - n
    q, k, v = (_fold_blocks(F.pad(t, (0, 0, 0, pad)).unflatten(-2, (blocks, size))) for t in (q, k, v))  # (b * blocks, H, c, .)
    allowed = _visible_keys(key_mask, batch, n, size, pad, causal, q.device)
    if bias is None:
        out = _attend(q, k, v, allowed, causal and allowed is None)
    else:
        if allowed is None and causal:
            allowed = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        out = _biased_attention(q, k, v, allowed, bias, max_scores)
    return out.unflatten(0, (batch, blocks)).transpose(1, 2).flatten(-3, -2)[..., :n, :]


def _visible_keys(key_mask, batch: int, n: int, size: int, pad: int, causal: bool, device) -> torch.Tensor | None:
    """Which keys a query may see, (batch * blocks, 1, 1 or c, c) bool, or None where every key (or,
    causal, every earlier key) is visible."""
    if key_mask is None and not (pad and not causal):
        return None
    real = torch.ones(batch, n, dtype=torch.bool, device=device) if key_mask is None else key_mask
    real = F.pad(real, (0, pad), value=False).view(-1, 1, 1, size)
    if causal:
        earlier = torch.ones(size, size, dtype=torch.bool, device=device).tril()
        return (real | torch.eye(size, dtype=torch.bool, device=device)) & earlier
    return real | ~real.any(-1, keepdim=True)  # a block of padding sees all of itself


def _attend(q, k, v, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """PyTorch's attention at scale e^-1/2; the math kernel inside ``double_backward()``, the one
    differentiable twice. The fused kernels need one head width for queries, keys and values, else
    PyTorch keeps every score for backward (MEGA: z-wide queries, 2z-wide values; 8 GB per step on
    Path-X). Where those scores would pass ``MAX_SCORES`` the narrower side is zero-padded, which
    changes neither q.k nor the output but costs up to (value width / key width) times the q.k work:
    short blocks (MEGA's chunks of 128) stay on the faster math kernel."""
    key_width, value_width = q.shape[-1], v.shape[-1]
    if key_width != value_width and q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2] > MAX_SCORES:
        if key_width < value_width:
            q, k = (F.pad(t, (0, value_width - key_width)) for t in (q, k))
        else:
            v = F.pad(v, (0, key_width - value_width))
    with sdpa_kernel(SDPBackend.MATH) if double_backward_enabled() else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=key_width**-0.5)
    return out[..., :value_width]


def _biased_attention(q, k, v, allowed: torch.Tensor | None, bias: RelativeBias, max_scores: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(e) + b[i - j]) v over the visible keys, a tile of query rows at a time.

    Each tile's bias (rows, c) is built from the bias function inside the tile, so with gradients on
    (and not inside ``double_backward()``) a tile is checkpointed: backward keeps its inputs only and
    recomputes its scores."""
    size = q.shape[-2]
    keys = torch.arange(size, device=q.device)
    rows = max(1, min(size, max_scores // max(1, q.shape[0] * q.shape[1] * size)))
    recompute = torch.is_grad_enabled() and not double_backward_enabled() and rows < size

    def tile(start: int, q_tile: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = bias(keys[start : start + q_tile.shape[-2]], keys).to(q_tile.dtype)
        if allowed is not None:
            visible = allowed[..., start : start + q_tile.shape[-2], :] if allowed.shape[-2] == size else allowed
            mask = mask.masked_fill(~visible, float("-inf"))
        return _attend(q_tile, k, v, mask, False)

    outputs = []
    for start in range(0, size, rows):
        q_tile = q[..., start : start + rows, :]
        outputs.append(checkpoint(tile, start, q_tile, k, v, use_reentrant=False) if recompute else tile(start, q_tile, k, v))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-2)


def attention_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    queries: torch.Tensor,
    keys: torch.Tensor,
    visible: torch.Tensor | None,
    causal: bool,
    bias: RelativeBias | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full attention's queries at positions ``queries`` over one block of its keys, at ``keys``: (out, lse),
    out = softmax(s) v over the block's allowed keys and lse = log sum exp s, the block's share of the
    softmax's normaliser (``merge_blocks`` adds blocks up: ring attention's blockwise softmax, Liu et al.
    2023, arXiv 2310.01889, §3).

    q (batch, heads, nq, e) and k (batch, heads, nk, e) arrive rotated to their positions; ``visible``
    (batch, nk) marks keys a query may see (None: all); causal, a query also sees itself and nothing
    later, as ``chunked_attention``. Disallowed scores are the dtype's lowest finite value, not -inf:
    a query the block shows nothing has lse ~ that value, so merging gives the block weight exactly 0
    and no NaN reaches a gradient."""
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias(queries, keys).to(scores.dtype)
    allowed = torch.ones(q.shape[0], 1, 1, k.shape[-2], dtype=torch.bool, device=q.device) if visible is None else visible[:, None, None]
    if causal:
        allowed = (allowed | (keys[None, :] == queries[:, None])) & (keys[None, :] <= queries[:, None])
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    lse = scores.logsumexp(dim=-1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def merge_blocks(first: tuple[torch.Tensor, torch.Tensor], second: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Two blocks' (out, lse) over disjoint keys -> those of their union: lse = log(e^lse1 + e^lse2),
    out = out1 e^(lse1 - lse) + out2 e^(lse2 - lse)."""
    (out1, lse1), (out2, lse2) = first, second
    lse = torch.logaddexp(lse1, lse2)
    return out1 * torch.exp(lse1 - lse)[..., None] + out2 * torch.exp(lse2 - lse)[..., None], lse


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


@dataclass
class AttentionCache(StreamState):
    """Keys (rotated) and values a later query may still see, (batch, heads, cached, width), which of them
    are real tokens (batch, cached), and the stream position. Chunked attention keeps the current
    chunk only, so its size is bounded by the chunk; full attention's grows with the stream."""

    keys: torch.Tensor
    values: torch.Tensor
    real: torch.Tensor
    position: int = 0


def empty_cache(
    batch_size: int, heads: int, key_width: int, value_width: int, device, dtype: torch.dtype, masked: int = 0
) -> AttentionCache:
    """A cache of no real keys; with ``masked``, the keys of that many masked positions (zeros: no later
    query sees one) and the position after them."""
    keys = torch.zeros(batch_size, heads, masked, key_width, device=device, dtype=dtype)
    values = torch.zeros(batch_size, heads, masked, value_width, device=device, dtype=dtype)
    return AttentionCache(keys, values, torch.zeros(batch_size, masked, dtype=torch.bool, device=device), masked)


Rotation = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]  # q, k, offset -> rotated


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: AttentionCache,
    chunk_size: int | None,
    mask: torch.Tensor | None,
    rotate: Rotation | None = None,
    bias: RelativeBias | None = None,
) -> tuple[torch.Tensor, AttentionCache]:
    """Causal attention of the next n tokens (q, k: (batch, heads, n, e), unrotated; v: (batch, heads, n, h))
    over the cache and themselves, the chunk-local rule of ``chunked_attention``: the cache empties at
    every multiple of ``chunk_size``. ``rotate(q, k, offset)`` places q and k at their stream
    positions (rotary), ``bias`` adds a relative bias. Returns (batch, heads, n, h) and the new cache."""
    batch, n = q.shape[0], q.shape[-2]
    real = torch.ones(batch, n, dtype=torch.bool, device=q.device) if mask is None else mask
    outputs, done = [], 0
    while done < n:
        start = cache.position
        room = n - done if chunk_size is None else chunk_size - start % chunk_size
        if chunk_size is not None and start % chunk_size == 0:
            cache = empty_cache(batch, q.shape[1], k.shape[-1], v.shape[-1], q.device, cache.keys.dtype)
            cache.position = start
        size = min(room, n - done)
        q_piece, k_piece = q[..., done : done + size, :], k[..., done : done + size, :]
        if rotate is not None:
            q_piece, k_piece = rotate(q_piece, k_piece, start)
        keys = torch.cat([cache.keys, k_piece.to(cache.keys.dtype)], dim=2)  # the cache keeps its dtype (under autocast too)
        values = torch.cat([cache.values, v[..., done : done + size, :].to(cache.values.dtype)], dim=2)
        key_real = torch.cat([cache.real, real[:, done : done + size]], dim=1)
        query_positions = torch.arange(start, start + size, device=q.device)
        key_positions = torch.arange(start + size - keys.shape[2], start + size, device=q.device)
        itself = query_positions[:, None] == key_positions[None, :]
        allowed = (key_positions[None, :] <= query_positions[:, None]) & (key_real[:, None, None, :] | itself)
        attn_mask = allowed
        if bias is not None:
            attn_mask = bias(query_positions, key_positions).to(q.dtype).masked_fill(~allowed, float("-inf"))
        outputs.append(F.scaled_dot_product_attention(q_piece, keys, values, attn_mask=attn_mask))
        cache = AttentionCache(keys, values, key_real, start + size)
        done += size
    return torch.cat(outputs, dim=2), cache


@dataclass
class StaticAttentionCache(StreamState):
    """An ``AttentionCache`` in fixed slots: keys (rotated) and values (batch, heads, slots, width), which slots hold
    real tokens (batch, slots), each row's stream position (batch,). Full attention keeps a slot per position up to
    the stream's capacity; chunked attention a slot per position of the current chunk (slot = position mod chunk)."""

    keys: torch.Tensor
    values: torch.Tensor
    real: torch.Tensor
    position: torch.Tensor


def static_cache(cache: AttentionCache, slots: int) -> StaticAttentionCache:
    """``cache`` in ``slots`` fixed slots (its keys in the first ones: a chunked cache holds its chunk's, in order)."""
    batch, heads, cached, _ = cache.keys.shape
    if cached > slots:
        raise ValueError(f"capacity must hold the {cached} keys the stream keeps, got {slots}")

    def widened(tensor: torch.Tensor, axis: int) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (0, 0) * (tensor.dim() - 1 - axis) + (0, slots - cached))

    position = torch.full((batch,), cache.position, dtype=torch.long, device=cache.keys.device)
    return StaticAttentionCache(widened(cache.keys, 2), widened(cache.values, 2), widened(cache.real, 1), position)


def static_cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: StaticAttentionCache,
    chunk_size: int | None,
    rotate: Rotation | None = None,
    bias: RelativeBias | None = None,
) -> torch.Tensor:
    """``cached_attention`` of one token per row (q, k: (batch, heads, 1, e), v: (batch, heads, 1, h)) at each row's
    position, its key written into its slot in place: the same kernels at every position (a CUDA graph replays it).
    A chunk's first token forgets the keys of the chunk before."""
    rows, position = torch.arange(q.shape[0], device=q.device), cache.position
    slot = position if chunk_size is None else position % chunk_size
    if rotate is not None:
        q, k = rotate(q, k, position)
    if chunk_size is not None:
        cache.real.masked_fill_(slot[:, None] == 0, False)
    cache.keys[rows, :, slot] = k[:, :, 0].to(cache.keys.dtype)
    cache.values[rows, :, slot] = v[:, :, 0].to(cache.values.dtype)
    cache.real[rows, slot] = True
    allowed = cache.real[:, None, None]  # (batch, 1, 1, slots): the slots past a row's own are not real yet
    attn_mask = allowed
    if bias is not None:  # offsets slot - j: key j of the chunk (or stream) lies slot - j positions back
        slots = torch.arange(cache.keys.shape[2], device=q.device)
        attn_mask = bias(slot, slots)[:, None, None].to(q.dtype).masked_fill(~allowed, float("-inf"))
    position += 1
    return F.scaled_dot_product_attention(q, cache.keys.to(q.dtype), cache.values.to(q.dtype), attn_mask=attn_mask)


# -- the forms of ``ops/forms.py``: x (batch, n, 3 h e) holds q, k, v of h heads; params heads, chunk_size ----


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, n, 3 h e) -> (3, batch, h, n, e)."""
    return x.view(x.shape[0], x.shape[1], 3, heads, -1).permute(2, 0, 3, 1, 4)


def _merged(y: torch.Tensor) -> torch.Tensor:
    return y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)


def _with_prefix(attend):
    """A causal form whose state is the prefix's inputs: the prefix and x attended as one stream, x's outputs kept."""

    def run(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
        full = x if initial_state is None else torch.cat([initial_state, x], dim=1)
        q, k, v = _heads(full, params["heads"])
        y = _merged(attend(q, k, v, params["chunk_size"]))[:, full.shape[1] - x.shape[1] :]
        return returned(y, full, output_final_state)

    return run


def naive_causal_attention(q, k, v, chunk_size):
    return naive_attention(q, k, v, chunk_mask(q.shape[2], chunk_size, True))


def parallel_causal_attention(q, k, v, chunk_size):
    return chunked_attention(q, k, v, chunk_size, True)


def recurrent_attention(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    """The prefix into a cache, then one token at a time over it (``cached_attention``, the decoding path)."""
    heads, chunk_size = params["heads"], params["chunk_size"]
    prefix = x[:, :0] if initial_state is None else initial_state
    cache = empty_cache(x.shape[0], heads, x.shape[2] // (3 * heads), x.shape[2] // (3 * heads), x.device, x.dtype)
    _, cache = cached_attention(*_heads(prefix, heads), cache, chunk_size, None)

    def step(token, cache):
        y, cache = cached_attention(*_heads(token, heads), cache, chunk_size, None)
        return _merged(y), cache

    y, _ = token_by_token(step, x, cache)
    return returned(y, torch.cat([prefix, x], dim=1), output_final_state)


def _attention_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    heads, width = 2, 2
    x, prefix = (torch.randn(batch, length, 3 * heads * width, dtype=dtype, generator=generator) for length in (n, 5))
    return x, {"heads": heads, "chunk_size": 4}, prefix


register_op(
    "causal_chunked_attention",
    OpForms(_with_prefix(naive_causal_attention), _with_prefix(parallel_causal_attention), recurrent_attention, _attention_example),
)


def _bidirectional(attend):
    """A bidirectional form: every query sees the keys of its block."""

    def run(x: torch.Tensor, params: dict) -> torch.Tensor:
        q, k, v = _heads(x, params["heads"])
        return _merged(attend(q, k, v, params["chunk_size"]))

    return without_state(run)


def _bidirectional_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    x, params, _ = _attention_example(batch, n, dim, dtype, generator)
    return x, params, None


register_op(
    "chunked_attention",
    OpForms(
        _bidirectional(lambda q, k, v, chunk_size: naive_attention(q, k, v, chunk_mask(q.shape[2], chunk_size, False))),
        _bidirectional(lambda q, k, v, chunk_size: chunked_attention(q, k, v, chunk_size, False)),
        None,
        _bidirectional_example,
    ),
)


# -- Transformer-XL's relative attention (Dai et al. 2019, §3.3) ------------------------------------------


def relative_attention(q, k, v, r, content_bias, position_bias, key_mask, dropout=None) -> torch.Tensor:
    """The newest n queries over a context of ``total`` keys ending with theirs, M = total - n before them:

        score(i, j) = ((q_i + u) . k_j + (q_i + v) . r_{M+i-j}) / sqrt(e),

    masked to j <= M + i and to the keys ``key_mask`` (batch, total) allows (a query always sees
    itself). q (batch, n, h, e); k, v (batch, total, h, e); r (>= total, h, e) by distance; u, v (h, e).
    The relative term is computed for every distance and gathered into place (instead of the
    "rel-shift" reshaping trick). ``dropout`` applies to the weights. Returns (batch, n, h, e)."""
    batch, n, heads, width = q.shape
    total = k.shape[1]
    content = torch.einsum("bihd,bjhd->bhij", q + content_bias.to(q.dtype), k)
    by_distance = torch.einsum("bihd,rhd->bhir", q + position_bias.to(q.dtype), r[:total])
    distance = (total - n) + torch.arange(n, device=q.device)[:, None] - torch.arange(total, device=q.device)[None, :]
    position = by_distance.gather(-1, distance.clamp(min=0).expand(batch, heads, n, total))
    blocked = (distance < 0) | ~(key_mask[:, None, None, :] | (distance == 0))
    scores = ((content + position) / math.sqrt(width)).masked_fill(blocked, torch.finfo(q.dtype).min)
    weights = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(q.dtype)
    if dropout is not None:
        weights = dropout(weights)
    return torch.einsum("bhij,bjhd->bihd", weights, v)


def naive_relative_attention(q, k, v, r, content_bias, position_bias, key_mask) -> torch.Tensor:
    """Reference: one query at a time, its scores over the keys it may see written out, then a softmax (tests only)."""
    batch, n, heads, width = q.shape
    memory = k.shape[1] - n
    out = torch.zeros_like(q)
    for b in range(batch):
        for i in range(n):
            keys = torch.tensor([j for j in range(memory + i + 1) if key_mask[b, j] or j == memory + i])
            for h in range(heads):
                scores = k[b, keys, h] @ (q[b, i, h] + content_bias[h]) + r[memory + i - keys, h] @ (q[b, i, h] + position_bias[h])
                out[b, i, h] = torch.softmax(scores / math.sqrt(width), 0) @ v[b, keys, h]
    return out


def _relative_form(attend):
    """x (batch, n, 3 h e) holds each token's q, k, v; the state is the earlier tokens (the context before x)."""

    def run(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
        full = x if initial_state is None else torch.cat([initial_state, x], dim=1)
        q = _heads(x, params["heads"])[0].transpose(1, 2)
        _, k, v = (part.transpose(1, 2) for part in _heads(full, params["heads"]))
        real = torch.ones(full.shape[:2], dtype=torch.bool, device=x.device)
        y = attend(q, k, v, params["distances"], params["content_bias"], params["position_bias"], real)
        return returned(y.reshape(x.shape[0], x.shape[1], -1), full, output_final_state)

    return run


def _recurrent_relative(x: torch.Tensor, params: dict, initial_state=None, output_final_state: bool = False):
    """One token at a time over the growing context (a relative_attention mixer's stream)."""
    parallel = _relative_form(relative_attention)
    step = lambda token, context: parallel(token, params, context, True)  # noqa: E731
    return returned(*token_by_token(step, x, x[:, :0] if initial_state is None else initial_state), output_final_state)


def _relative_example(batch: int, n: int, dim: int, dtype: torch.dtype, generator: torch.Generator):
    heads, width, before = 2, 2, 4
    x, prefix = (torch.randn(batch, length, 3 * heads * width, dtype=dtype, generator=generator) for length in (n, before))
    distances, content_bias, position_bias = (
        torch.randn(shape, dtype=dtype, generator=generator) for shape in ((before + n, heads, width), (heads, width), (heads, width))
    )
    params = {"heads": heads, "distances": distances, "content_bias": content_bias, "position_bias": position_bias}
    return x, params, prefix


register_op(
    "relative_attention",
    OpForms(_relative_form(naive_relative_attention), _relative_form(relative_attention), _recurrent_relative, _relative_example),
)
