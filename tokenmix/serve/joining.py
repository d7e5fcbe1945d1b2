"""Where a new sequence joins the batch: right-aligned rows and the prefill schedule that lands them.

Rows that share one streaming state share its position. A prompt of L tokens read after ``pads``
masked positions stands at position pads + L, and a model whose ``front_padding_period`` divides
``pads`` gives its real tokens the logits of the prompt alone (``SequenceModel.front_padding_period``).
So a new prompt can join a batch already at position P: it is prefilled, one chunk per scheduler
iteration, while the batch steps one token per iteration, and lands at P + k after k iterations
when pads = P + k - L. ``join_plan`` picks the k. Where no such padding exists, the prompt's first
P + k - pads tokens are read so, and its tail in the batch, one token per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_WAIT = 32  # iterations a prefill may idle to land on a batch, at one step each: a short delay of its first token
MAX_TAIL = 128  # prompt tokens a row may read in its batch, one per step (``join_plan``'s tails)
PAD_FLOOR = 256  # padding always allowed (a row may otherwise at most double its length)
JOIN_EVERY = 8  # prefills land, where they can, on iterations that are multiples of this: one copy of the batch's state for all


@dataclass(frozen=True)
class JoinPlan:
    """``iterations`` until the row joins (0: at once), at ``position``, after ``pads`` masked positions in front,
    with its prompt's last ``tail`` tokens still to read in the batch, one per step."""

    iterations: int
    position: int
    pads: int
    tail: int = 0


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

    A new prompt that cannot land with its whole prompt read (the batch stands too far behind it to
    be met within the wait, or ahead of it by other than the whole periods of padding the prompt may
    take) lands with a tail: it reads its first tokens, joins, and reads the rest in the batch, one
    token per step (as ``tokenmix.generate`` reads a batch's longer prompts), at most ``MAX_TAIL``
    of them. Of the ways it can, the first that lands at one of ``landings`` (positions where
    unstarted prefills of new prompts land: it is read with them, as one batch), else on an
    iteration (counted from ``now``) that is a multiple of ``JOIN_EVERY``, else the soonest: joining
    copies the batch's state, once for all that land together."""
    room = max(PAD_FLOOR, tokens + max_tokens)  # the padding a row's reservation allows
    plans = _whole_prompt_plans(batch_position, start, tokens, chunk, period, max_tokens, context, room)
    if not plans and start == 0:
        plans = _tail_plans(batch_position, tokens, chunk, period, max_tokens, context, room)
    if not plans:
        return None
    shared = (plan for plan in plans if plan.position in landings)
    return next(shared, next((plan for plan in plans if (now + plan.iterations) % JOIN_EVERY == 0), plans[0]))


def _whole_prompt_plans(batch_position, start, tokens, chunk, period, max_tokens, context, room) -> list[JoinPlan]:
    """The landings with the whole prompt read, soonest first: padded by whole periods (a new prompt) or not at all."""
    fewest = chunks_needed(tokens, chunk)
    lag = start + tokens - batch_position  # iterations that land it unpadded
    if start > 0 or period is None:
        candidates = range(lag, lag + 1)
    else:
        first = max(fewest, lag)
        candidates = range(first + (lag - first) % period, fewest + MAX_WAIT + 1, period)  # pads: multiples of the period
    last = min(fewest + MAX_WAIT, context - max_tokens - batch_position)
    usable = [iterations for iterations in candidates if fewest <= iterations <= last and iterations - lag <= room]
    return [JoinPlan(iterations, batch_position + iterations, iterations - lag) for iterations in usable]


def _tail_plans(batch_position, tokens, chunk, period, max_tokens, context, room) -> list[JoinPlan]:
    """The landings of a new prompt with a tail, soonest first: at each position, the least padding (whole
    periods) that leaves at most the prompt to read before it, of which at least one token."""
    plans = []
    for iterations in range(1, chunks_needed(tokens, chunk) + MAX_WAIT + 1):
        position = batch_position + iterations
        pads = max(0, position - tokens)
        if period is None and pads:
            continue
        pads = -(-pads // (period or 1)) * (period or 1)
        read = position - pads
        fits = pads <= room and pads + tokens + max_tokens <= context
        if (
            fits
            and 1 <= read
            and tokens - read <= MAX_TAIL
            and chunks_needed(read, chunk) <= iterations <= chunks_needed(read, chunk) + MAX_WAIT
        ):
            plans.append(JoinPlan(iterations, position, pads, tokens - read))
    return plans


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
