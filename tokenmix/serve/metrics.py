"""What ``GET /metrics`` reports, in the Prometheus text format (prometheus_client, one registry per server)."""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from . import ENGINE_PHASES

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RATE_WINDOW = 5.0  # seconds over which tokens per second is averaged


class PhaseClock:
    """Adds the time since its last lap to ``counter`` under a phase label, one of ``ENGINE_PHASES``
    (``ServeMetrics.engine_seconds``)."""

    def __init__(self, counter):
        self.counter, self.last = counter, time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.counter.labels(phase).inc(now - self.last)
        self.last = now


class ServeMetrics:
    """Counters, gauges and latency histograms of one server, updated by its engine."""

    def __init__(self):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, memory... (where /proc exists: Linux)
        options = {"registry": self.registry, "namespace": "tokenmix"}
        self.requests = Counter("requests", "Completion requests by outcome", ["outcome"], **options)
        self.prompt_tokens = Counter("prompt_tokens", "Prompt tokens admitted", **options)
        self.completion_tokens = Counter("completion_tokens", "Tokens generated", **options)
        self.prefix_hits = Counter("prefix_cache_hits", "Requests that resumed from a cached prompt's state", **options)
        self.first_token = Histogram("time_to_first_token_seconds", "From arrival to the first token", buckets=LATENCY_BUCKETS, **options)
        self.per_token = Histogram(
            "time_per_output_token_seconds", "A request's mean time between its tokens", buckets=LATENCY_BUCKETS, **options
        )
        self.batch_size = Gauge("batch_size", "Rows decoding in the last iteration", **options)
        self.queue = Gauge("queue_length", "Requests waiting or reading their prompt", **options)
        self.state_bytes = Gauge("state_bytes", "Bytes held by streaming states and the prefix cache", **options)
        self.state_bytes_peak = Gauge("state_bytes_peak", "The most state_bytes has been since the server started", **options)
        self.engine_seconds = Counter(
            "engine_seconds",
            "Seconds the engine spent adding read prompts to their batch (join), decoding steps with sampling (decode), "
            "reading prompts (prefill) and the rest (schedule: admission, gauges); dropping holes counts in the phase "
            "that drops them",
            ["phase"],
            **options,
        )
        for phase in ENGINE_PHASES:
            self.engine_seconds.labels(phase)  # every phase reported from the start
        self.tokens_per_second = Gauge("tokens_per_second", f"Tokens generated per second over the last {RATE_WINDOW:g} s", **options)
        self._recent: deque = deque()

    def made(self, tokens: int) -> None:
        """An iteration made ``tokens`` tokens: counted, and the rate updated."""
        now = time.monotonic()
        self.completion_tokens.inc(tokens)
        self._recent.append((now, tokens))
        while self._recent[0][0] < now - RATE_WINDOW:
            self._recent.popleft()
        span = now - self._recent[0][0]
        self.tokens_per_second.set(sum(count for _, count in self._recent) / span if span > 0 else 0.0)

    def held(self, state_bytes: int) -> None:
        """The states hold ``state_bytes`` now."""
        self.state_bytes.set(state_bytes)
        self.state_bytes_peak.set(max(state_bytes, self.state_bytes_peak._value.get()))

    def text(self) -> bytes:
        return generate_latest(self.registry)
