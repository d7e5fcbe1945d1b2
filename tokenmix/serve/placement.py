"""Where an admitted request's prompt is read and which batch it joins: the scheduler's placement.

Each request is planned onto a batch (a *cohort*: rows sharing one streaming state at one position)
where its prompt, padded in front, lands right-aligned (``joining.py``), or, where no padding can, lands
with its last tokens still to read in the cohort (a tail), or starts a cohort of its own (padded to the
longest recent prompt, so that prompts like it arriving later can join); a prompt that begins with a
cached one resumes from that prompt's state (``prefix_cache.py``: exact, states are exact).
"""

from __future__ import annotations

import threading
from collections import deque

from .batches import Cohort, Prefill
from .config import EngineConfig
from .jobs import Job, Sampling
from .joining import MAX_WAIT, PAD_FLOOR, JoinPlan, alone_plan, join_plan
from .metrics import ServeMetrics
from .prefix_cache import PrefixCache


class Placement:
    """Plans each admitted job into ``prefills`` towards one of ``cohorts`` (both the scheduler's lists,
    changed in place); ``cache`` is read under ``lock`` (admission evicts from it in other threads)."""

    def __init__(
        self,
        config: EngineConfig,
        period: int | None,
        cohorts: list[Cohort],
        prefills: list[Prefill],
        cache: PrefixCache,
        lock: threading.Condition,
        metrics: ServeMetrics,
    ):
        self.config, self.period, self.cohorts, self.prefills = config, period, cohorts, prefills
        self.cache, self.lock, self.metrics = cache, lock, metrics
        self.recent_prompts: deque[int] = deque(maxlen=config.max_batch)  # the lengths of the last prompts admitted
        self.now = 0  # the scheduler's iteration

    def admit(self, jobs: list[Job], now: int) -> None:
        """Plan ``jobs`` (the shortest first: its batch is padded to the longest) at iteration ``now``."""
        self.now = now
        self.recent_prompts.extend(len(job.prompt) for job in jobs)
        for job in jobs:
            self.metrics.prompt_tokens.inc(len(job.prompt))
            self.place(job)

    def place(self, job: Job) -> None:
        prompt, sampling, config = tuple(job.prompt), job.sampling, self.config
        room = max(PAD_FLOOR, len(prompt) + sampling.max_tokens)  # the padding its reservation allows

        def fits(entry) -> bool:
            return entry.pads <= room and entry.pads + len(prompt) + sampling.max_tokens <= config.context

        with self.lock:  # admission evicts from the cache in the HTTP threads
            cached_key = self.cache.longest_start(prompt, fits)
            cached = self.cache[cached_key] if cached_key is not None else None
        if cached is not None:
            start = cached.pads + len(cached_key)
            landing = self._landing(start, len(prompt) - len(cached_key), sampling)
            if landing is None and len(cached_key) < config.chunk:
                cached_key = cached = None  # it would start a batch at its own position to save less than one chunk of reading
        if cached is None:
            start, landing = 0, self._landing(0, len(prompt), sampling)
        else:
            self.metrics.prefix_hits.inc()
        remaining = prompt[len(cached_key or ()) :]
        if landing is not None:
            cohort, plan = landing
        else:
            plan = alone_plan(start, len(remaining), config.chunk, 0 if cached else self._starting_pads(len(prompt), sampling))
            cohort = Cohort(plan.position - plan.iterations)
            self.cohorts.append(cohort)
        cohort.joining += 1
        if cached is None:  # a new prompt joins the unstarted prefill landing alike: one batch, read and joined once
            alike = (prefill for prefill in self._unstarted(cohort) if prefill.plan.position == plan.position)
            prefill = next(alike, None)
            if prefill is not None:
                prefill.add(job, prompt, plan.pads, plan.tail)
                return
        prefill = Prefill([], [], [], cohort, plan, [], [])
        if cached is None:
            prefill.add(job, prompt, plan.pads, plan.tail)
        else:
            prefill.jobs, prefill.prompts, prefill.pads, prefill.tokens = [job], [prompt], [cached.pads], [list(remaining)]
            prefill.tails = [()]
            prefill.resumed, prefill.state, prefill.logits = True, cached.state.select([0]), cached.logits
        self.prefills.append(prefill)

    def _starting_pads(self, tokens: int, sampling: Sampling) -> int:
        """Padding for a new prompt of ``tokens`` tokens that starts a batch: up to the longest of the recent
        prompts, so that prompts like them, arriving over the next iterations, can join it (a batch takes
        those that fit before its position, padded, or within ``MAX_WAIT`` iterations past it). Whole
        periods, within what its reservation allows and the context."""
        if self.period is None:
            return 0
        room = min(max(PAD_FLOOR, tokens + sampling.max_tokens), self.config.context - sampling.max_tokens - tokens)
        pads = min(max(self.recent_prompts, default=0) - tokens, room)
        return max(0, pads - pads % self.period)

    def _landing(self, start: int, tokens: int, sampling: Sampling) -> tuple[Cohort, JoinPlan] | None:
        """The running batch a stream at ``start`` with ``tokens`` prompt tokens to read joins, and how; None
        when it joins none (``join_plan``), or none long enough to share ``min(max_tokens, MAX_WAIT)``
        steps with it (worth its padding) past its tail (a tail read by a row left alone costs a step per
        token). Of those it can join, the fullest, then the soonest."""
        limits = (self.config.chunk, self.period, sampling.max_tokens, self.config.context, self.now)
        plans = [(cohort, join_plan(cohort.position, start, tokens, *limits, self._landings(cohort))) for cohort in self.cohorts]
        shared = min(sampling.max_tokens, MAX_WAIT)

        def lasting(cohort: Cohort, plan: JoinPlan) -> bool:
            return cohort.joining > 0 or cohort.life() - plan.iterations >= shared + plan.tail

        plans = [(cohort, plan) for cohort, plan in plans if plan is not None and lasting(cohort, plan)]
        return max(plans, key=lambda pair: (len(pair[0].alive()) + pair[0].joining, -pair[1].iterations), default=None)

    def _unstarted(self, cohort: Cohort) -> list[Prefill]:
        """The prefills of new prompts landing on ``cohort`` that have read nothing yet (others may join them)."""
        return [prefill for prefill in self.prefills if prefill.cohort is cohort and not prefill.resumed and prefill.state is None]

    def _landings(self, cohort: Cohort) -> frozenset[int]:
        return frozenset(prefill.plan.position for prefill in self._unstarted(cohort))
