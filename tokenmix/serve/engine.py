"""Continuous batching over streaming states: the engine behind ``tokenmix serve``.

One thread owns the model. Each iteration is vLLM v1's ``EngineCore.step``: the ``Scheduler`` plans it
(``StepPlan``: admission, the prompts read that join their batch, one step of every batch, one chunk of
every prompt being read), the ``ModelRunner`` executes the plan on the model (the ``Sampler`` draws the
tokens), the ``OutputProcessor`` turns the tokens into each request's events, and the scheduler updates
its bookkeeping from them. A row's next token is drawn from the logits of its batch's last step, before
this one, so that a row reaching ``max_tokens`` leaves before the step.

Memory is admitted by the states' bytes (``StateSizes``): a request that would take the states past
the budget is refused (``Busy``: HTTP 429) rather than queued without bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .config import EngineConfig
from .jobs import Job
from .memory import StateSizes
from .metrics import PhaseClock, ServeMetrics
from .output import OutputProcessor
from .runner import ModelRunner
from .sampler import Sampler
from .scheduler import Scheduler

BURST_QUIET, BURST_MAX = 0.002, 0.02  # seconds: an idle engine waits for the rest of a burst of requests (``_await_burst``)


class Engine:
    """``submit`` jobs from any thread; ``run`` (in one thread) serves them, one ``step`` at a time, until
    ``stop``. ``model``: a causal LM; ``token_bytes``: each token id's bytes (the tokenizer's)."""

    def __init__(self, model, token_bytes: list[bytes], config: EngineConfig):
        self.metrics = ServeMetrics()
        self.runner = ModelRunner(model, Sampler(token_bytes), config)
        sizes = StateSizes(model.eval(), config.context, next(model.parameters()).device, self.runner.static)
        self.scheduler = Scheduler(config, sizes, model.front_padding_period, token_bytes, self.metrics)
        self.outputs = OutputProcessor(self.metrics)
        self.stopped = False

    def submit(self, job: Job) -> None:
        """Queue ``job`` or refuse it (``Scheduler.submit``)."""
        self.scheduler.submit(job)

    def drain(self) -> None:
        self.scheduler.drain()

    def idle(self) -> bool:
        return self.scheduler.idle()

    def stop(self) -> None:
        with self.scheduler.lock:
            self.stopped = True
            self.scheduler.lock.notify()

    def run(self, after_step: Callable[[], None] | None = None) -> None:
        """Serve until ``stop``: one step whenever there is work, asleep otherwise; ``after_step`` is called
        after each (the engine's process sends the step's events then)."""
        lock = self.scheduler.lock
        while True:
            with lock:
                if not self.scheduler.has_work():  # idle: wait for a request, then for the rest of its burst
                    while not self.stopped and not self.scheduler.waiting:
                        lock.wait()
                    self._await_burst()
                if self.stopped:
                    return
            try:
                with torch.no_grad():
                    self.step()
            except Exception as error:  # noqa: BLE001 - every running request learns of it; the server goes on
                self.scheduler.fail_all(f"the model failed: {type(error).__name__}: {error}")
            if after_step is not None:
                after_step()

    def _await_burst(self) -> None:
        """Under the lock, on an idle engine that just got a request: wait while more keep coming (each within
        ``BURST_QUIET`` seconds of the last, for at most ``BURST_MAX``), so that requests sent together are
        read as one batch (a first request read alone makes the rest join it: a copy of the batch's state)."""
        deadline = time.monotonic() + BURST_MAX
        while not self.stopped:
            seen = len(self.scheduler.waiting)
            self.scheduler.lock.wait(min(BURST_QUIET, max(0.0, deadline - time.monotonic())))
            if len(self.scheduler.waiting) == seen or time.monotonic() >= deadline:
                return

    def step(self) -> None:
        """One iteration: schedule -> execute -> update (each phase's time in ``tokenmix_engine_seconds``)."""
        clock = PhaseClock(self.metrics.engine_seconds)
        plan = self.scheduler.schedule()
        clock.lap("schedule")
        output = self.runner.execute(plan, clock.lap)  # laps "join", "decode", "prefill"
        ended = self.outputs.process(output.sampled)
        clock.lap("decode")
        self.scheduler.update_from_output(plan, ended)
        self.outputs.gauges(len(output.sampled), *self.scheduler.load())
        clock.lap("schedule")
