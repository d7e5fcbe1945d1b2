"""Where a new sequence joins the batch: right-aligned rows and the prefill schedule that lands them.

Rows that share one streaming state share its position. A prompt of L tokens read after ``pads``
masked positions stands at position pads + L, and a model whose ``front_padding_period`` divides
``pads`` gives its real tokens the logits of the prompt alone (``SequenceModel.front_padding_period``).
So a new prompt can join a batch already at position P: it is prefilled, one chunk per scheduler
iteration, while the batch steps one token per iteration, and lands at P + k after k iterations
when pads = P + k - L. ``join_plan`` picks the k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_WAIT = 32  # iterations a prefill may idle to land on a batch, at one step each: a short delay of its first token
PAD_FLOOR = 256  # padding always allowed (a row may otherwise at most double its length)
JOIN_EVERY = 8  # prefills land, where they can, on iterations that are multiples of this: one copy of the batch's state for all


@dataclass(frozen=True)
class JoinPlan:
    """``iterations`` until the row joins (0: at once), at ``position``, after ``pads`` masked positions in front."""

    iterations: int
    position: int
    pads: int


def chunks_needed(tokens: int, chunk: int) -> int:
    """Scheduler iterations a prefill of ``tokens`` tokens takes, ``chunk`` at most per iteration."""
    return math.ceil(tokens / chunk)


def join_plan(
    batch_position: int,
    start: int,
    tokens: int,
    chunk: int,
    period: int | None,
    max_tokens: int,
    context: int,
    now: int = 0,
    landings: frozenset[int] = frozenset(),
) -> JoinPlan | None:
    """How a stream at position ``start`` (0: a new prompt, which may be padded; else a cached prefix,
    which may not) with ``tokens`` prompt tokens still to read joins a batch now at ``batch_position``,
    or None when it cannot within ``MAX_WAIT`` iterations, the padding budget and the ``context``.
    Of the ways it can, the first that lands at one of ``landings`` (positions where unstarted
    prefills of new prompts land: it is read with them, as one batch), else on an iteration (counted
    from ``now``) that is a multiple of ``JOIN_EVERY``, else the soonest: joining copies the batch's
    state, once for all that land together."""
    fewest = chunks_needed(tokens, chunk)
    lag = start + tokens - batch_position  # iterations that land it unpadded
    if start > 0 or period is None:
        candidates = range(lag, lag + 1)
    else:
        first = max(fewest, lag)
        candidates = range(first + (lag - first) % period, fewest + MAX_WAIT + 1, period)  # pads: multiples of the period
    room, last = max(PAD_FLOOR, tokens + max_tokens), min(fewest + MAX_WAIT, context - max_tokens - batch_position)
    usable = [iterations for iterations in candidates if fewest <= iterations <= last and iterations - lag <= room]
    if not usable:
        return None
    shared = (it for it in usable if batch_position + it in landings)
    iterations = next(shared, next((it for it in usable if (now + it) % JOIN_EVERY == 0), usable[0]))
    return JoinPlan(iterations, batch_position + iterations, iterations - lag)


def alone_plan(start: int, tokens: int, chunk: int, pads: int = 0) -> JoinPlan:
    """A stream that starts a batch of its own, after ``pads`` masked positions, as fast as its chunks allow
    (the padding is not read: the state starts after it)."""
    return JoinPlan(chunks_needed(tokens, chunk), start + pads + tokens, pads)


def chunk_sizes(tokens: int, chunk: int, iterations: int) -> list[int]:
    """Tokens to read in each of ``iterations`` iterations: nothing first while the prefill waits, then
    even chunks that end in the last iteration, of at most ``chunk`` unless padding made the rows
    longer than that many iterations of ``chunk`` hold."""
    count = min(iterations, chunks_needed(tokens, chunk))
    sizes = [tokens // count + (index < tokens % count) for index in range(count)] if count else []
    return [0] * (iterations - count) + sizes
