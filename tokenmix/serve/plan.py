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
    batch_position: int, start: int, tokens: int, chunk: int, period: int | None, max_tokens: int, context: int
) -> JoinPlan | None:
    """How a stream at position ``start`` (0: a new prompt, which may be padded; else a cached prefix,
    which may not) with ``tokens`` prompt tokens still to read joins a batch now at ``batch_position``,
    or None when it cannot within ``MAX_WAIT`` iterations, the padding budget and the ``context``."""
    fewest = chunks_needed(tokens, chunk)
    lag = start + tokens - batch_position  # iterations that land it unpadded
    if start > 0 or period is None:
        iterations = lag
    else:
        iterations = max(fewest, lag)
        iterations += (lag - iterations) % period  # pads = iterations - lag: a multiple of the period
    pads = iterations - lag
    if iterations < fewest or iterations - fewest > MAX_WAIT or pads > max(PAD_FLOOR, tokens + max_tokens):
        return None
    position = batch_position + iterations
    return None if position + max_tokens > context else JoinPlan(iterations, position, pads)


def alone_plan(start: int, tokens: int, chunk: int) -> JoinPlan:
    """A stream that starts a batch of its own: unpadded, as fast as its chunks allow."""
    return JoinPlan(chunks_needed(tokens, chunk), start + tokens, 0)


def chunk_sizes(tokens: int, chunk: int, iterations: int) -> list[int]:
    """Tokens to feed in each of ``iterations`` iterations: nothing first while the prefill waits, then
    even chunks of at most ``chunk`` that end in the last iteration."""
    count = chunks_needed(tokens, chunk)
    if count > iterations:
        raise ValueError(f"{tokens} tokens need {count} chunks of {chunk}, more than {iterations} iterations")
    sizes = [tokens // count + (index < tokens % count) for index in range(count)] if count else []
    return [0] * (iterations - count) + sizes
