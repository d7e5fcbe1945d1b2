"""What a row's streaming state weighs: measured once on the model, read by admission (the memory budget),
by compaction (where a state grows) and by the spare rows of static buffers."""

from __future__ import annotations

from itertools import pairwise

import torch

from ..generation.graphs import graph_batch
from .joining import PAD_FLOOR


class StateSizes:
    """Bytes one row's state holds at a position, measured once on the model itself: a row streamed
    to each power of two up to ``context`` (each bound holds every position below it, capacity and
    cache growth included); with ``static`` decoding, at least the static buffers a row holds from the
    moment it joins its batch (those of the whole context, ``SequenceModel.static_state``)."""

    def __init__(self, model, context: int, device, static: bool = False):
        self.context, self.static = context, static
        self.bounds: list[tuple[int, int]] = []
        fixed, length = 0, 1  # fixed: the static buffers' bytes, the same at every position
        with torch.no_grad():
            while True:
                length = min(length, context)
                state = model.init_state(1, max_length=context, device=device)
                _, state = model(torch.zeros(1, length, dtype=torch.long, device=device), state=state, return_state=True)
                if static and not fixed:
                    fixed = model.static_state(state, context).nbytes()
                self.bounds.append((length, max(state.nbytes(), fixed)))
                if length == context:
                    break
                length *= 2
        self.static_row = fixed  # bytes of one row's static buffers (0 without static decoding)

    def at(self, position: int) -> int:
        """Bytes of one row up to ``position`` (at most the context)."""
        return next((size for bound, size in self.bounds if bound >= position), self.bounds[-1][1])

    def grows_at(self, position: int) -> bool:
        """Whether a state reaching ``position`` grows there: a bound holding more bytes than the one before
        (a Toeplitz state doubles its history on the step to each power of two; a fixed-size state never grows)."""
        return any(bound == position and size > before for (_, before), (bound, size) in pairwise(self.bounds))

    def compaction_due(self, cohort) -> bool:
        """Whether a cohort's holes go before its next step: holes three quarters of the rows; streamed (static buffers
        neither grow nor outgrow a hole), also a hole past its reservation or a quarter of the live rows on a step where
        the state grows."""
        holes = len(cohort.holes)
        if self.static:
            return 4 * holes >= 3 * len(cohort.rows)
        outgrown = any(nbytes < self.at(cohort.position + 1) for nbytes in cohort.holes.values())
        grows = self.grows_at(cohort.position) and 4 * holes >= len(cohort.rows) - holes
        return outgrown or 4 * holes >= 3 * len(cohort.rows) or grows

    def spare_rows(self, rows: int, max_batch: int, free_bytes: int) -> int:
        """With static buffers, the spare rows a batch of ``rows`` made anew gets: up to a ``graph_batch`` of rows, at
        most ``max_batch`` in all, and each holding one row's static buffers within ``free_bytes``; none streamed."""
        if not self.static:
            return 0
        return max(0, min(graph_batch(rows) - rows, max_batch - rows, free_bytes // self.static_row))

    def row_bytes(self, prompt: int, max_tokens: int) -> int:
        """The most a row of this prompt and completion may hold, whatever padding it is given."""
        padded = prompt + max_tokens + max(PAD_FLOOR, prompt + max_tokens)
        return self.at(min(padded, self.context))
