"""The output processor: sampled tokens become a request's events (text, stop strings, logprobs) and
its latency metrics."""

from __future__ import annotations

import time

from .jobs import Finished, Token
from .metrics import ServeMetrics
from .step import SampledToken


class OutputProcessor:
    """Emits each sampled token's ``Token`` event (the text it makes final: UTF-8 decoded incrementally,
    held back while it may begin a stop string, ``text.py``) and, where its choice ends (a stop string or
    ``max_tokens``), a ``Finished`` event; records each request's time to its first token."""

    def __init__(self, metrics: ServeMetrics):
        self.metrics = metrics

    def process(self, sampled: list[SampledToken]) -> list[SampledToken]:
        """Emit the events of ``sampled`` (in order); returns those whose choice ended."""
        now = time.monotonic()
        ended = []
        for item in sampled:
            row, token, logprobs = item.row, item.token, item.logprobs
            job = row.job
            if job.first_token is None:
                job.first_token = now
                self.metrics.first_token.observe(now - job.arrived)
            row.tokens.append(token)
            job.tokens += 1
            if logprobs is not None:  # where the token's text begins in the completion's (characters)
                logprobs["offset"] = len(row.text.raw.decode("utf-8", errors="replace"))
            job.emit(Token(row.choice, token, row.text.add(token), logprobs))
            reason = "stop" if row.text.stopped else "length" if len(row.tokens) >= job.sampling.max_tokens else None
            if reason is not None:
                job.emit(Finished(row.choice, reason, row.text.finish()))
                ended.append(item)
        return ended

    def gauges(self, made: int, batch_size: int, queue: int, held_bytes: int) -> None:
        """An iteration made ``made`` tokens with ``batch_size`` rows decoding, ``queue`` requests waiting
        or reading, the states holding ``held_bytes``."""
        self.metrics.made(made)
        self.metrics.batch_size.set(batch_size)
        self.metrics.queue.set(queue)
        self.metrics.held(held_bytes)
