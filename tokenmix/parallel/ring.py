"""Ring attention: full attention split over the processes of a context-parallel group by sequence,
for attention whose heads the processes cannot share evenly (Liu, Zaharia and Abbeel, "Ring Attention
with Blockwise Transformers for Near-Infinite Context", arXiv 2310.01889).

Each process keeps its shard's queries; the shards' keys and values travel round the ring (rank r
sends to r + 1), P - 1 passes, and each process attends its queries over every block as it arrives,
adding blocks by their log-sum-exp (``ops.attention.merge_blocks``). Causal, a block from a later
shard is passed on without being attended. Each block's scores are recomputed in the backward pass
(activation checkpointing): a process keeps (its length / P) x (a block's length) scores at a time,
not (its length / P) x length. The passes are ``exchange``'s differentiable all-to-all with every
piece empty but the one to the next rank: the backward sends each block's gradient back round the ring.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ..ops.attention import merge_blocks
from ..ops.second_order import double_backward_enabled
from .exchange import exchange
from .shards import ContextShard


def pass_on(block: torch.Tensor, source: int, shard: ContextShard) -> torch.Tensor:
    """Send ``block`` (batch, heads, n, width), the keys and values of shard ``source``, to the next rank;
    return those the previous rank sends: shard ``source - 1``'s."""
    size, rank = shard.size, shard.rank
    empty = block.new_empty(0)
    pieces = [block if index == (rank + 1) % size else empty for index in range(size)]
    start, stop = shard.bounds[(source - 1) % size]
    shapes = [(*block.shape[:2], stop - start, block.shape[-1]) if index == (rank - 1) % size else (0,) for index in range(size)]
    return exchange(pieces, shapes, shard.group)[(rank - 1) % size]


def ring_attention(core, qkv, shard: ContextShard, mask: torch.Tensor | None) -> torch.Tensor:
    """``core``'s full attention (an ``AttentionCore``) of this shard's q (batch, heads, n, key_width) over
    every shard's k and v (v: value_width); ``mask`` the whole (batch, length) padding mask."""
    q, k, v = qkv
    q, k = core.rotate(q, k, shard.start)
    travelling, key_width = torch.cat([k, v], dim=-1), k.shape[-1]
    recompute = torch.is_grad_enabled() and not double_backward_enabled()
    merged, source = None, shard.rank
    for turn in range(shard.size):
        if turn:
            travelling = pass_on(travelling, source, shard)
            source = (source - 1) % shard.size
        key_start = shard.bounds[source][0]
        if core.causal and key_start >= shard.stop:
            continue
        k_block, v_block = travelling.split([key_width, travelling.shape[-1] - key_width], dim=-1)
        arguments = ((q, k_block, v_block), shard.start, key_start, mask)
        block = checkpoint(core.attend_block, *arguments, use_reentrant=False) if recompute else core.attend_block(*arguments)
        merged = block if merged is None else merge_blocks(merged, block)
    # Every process's backward must run every pass's exchange: the last block stays in the graph even
    # where it was not attended (zero times one of its numbers).
    return merged[0] + travelling.flatten()[:1].sum() * 0
