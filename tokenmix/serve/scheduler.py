"""The scheduler: admission under the memory budget, where each request's prompt is read and joins a
batch (``placement.py``), and each iteration's ``StepPlan``; it keeps the bookkeeping (rows, holes,
reservations), the model runner the tensors.

Each ``schedule()``:

1. drops the sequences whose client went away, and admits the waiting requests (``Placement``);
2. lands the prefills that are done reading in their cohort: into its holes, the rest appended;
3. plans one step of every cohort: a row still reading its prompt takes its next token, the others
   sample; a row that reaches ``max_tokens`` leaves a hole, and the holes are dropped (compaction,
   ``StateSizes.compaction_due``) when
   they are three quarters of the batch, or a quarter of its live rows where the state grows
   (``StateSizes.grows_at``: that step copies every row anyway, and a Toeplitz state's also adds its
   largest block of inputs to the outputs ahead, up to the furthest row's end, ``limit_steps``); static
   buffers (``EngineConfig.decoding``) neither grow nor outgrow a hole: there only the three quarters, and
   a batch whose buffers are made anew gets spare rows up to a ``graph_batch`` (``_pad``);
4. plans one chunk of every prefill, so a long prompt never stalls the running rows for long.

``update_from_output`` then retires the rows that ended (a row stopped by a stop string leaves a hole
there, after its step), caches read prompts and drops the cohorts left empty.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from .batches import Cohort, Prefill, Row
from .config import EngineConfig
from .jobs import Busy, Failed, Job, Unavailable
from .memory import StateSizes
from .metrics import ServeMetrics
from .placement import Placement
from .prefix_cache import PrefixCache
from .step import ChunkStep, DecodeStep, JoinStep, SampledToken, StepPlan


class Scheduler:
    """``submit`` jobs from any thread (under ``lock``); ``schedule`` and ``update_from_output`` in the
    engine's thread. ``reserved``: state bytes the admitted requests may hold; ``rows``: their choices."""

    def __init__(self, config: EngineConfig, sizes: StateSizes, period: int | None, token_bytes: list[bytes], metrics: ServeMetrics):
        self.config, self.sizes, self.token_bytes, self.metrics = config, sizes, token_bytes, metrics
        self.lock = threading.Condition()
        self.waiting: deque[Job] = deque()
        self.prefills: list[Prefill] = []
        self.cohorts: list[Cohort] = []
        self.cache = PrefixCache(config.prefix_min, config.prefix_entries)
        self.placement = Placement(config, period, self.cohorts, self.prefills, self.cache, self.lock, metrics)
        self.reserved = self.rows = 0
        self.accepting, self.iterations = True, 0
        self.unfinished: set[Job] = set()  # admitted and not yet answered in full: what a failure must reach

    # -- any thread ------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue ``job``, or raise ``Busy`` (no room now) / ``Unavailable`` (shutting down) / ValueError
        (it could never fit: the request asks more than the server's limits)."""
        config, sampling, need_rows, tokens = self.config, job.sampling, job.sampling.n, len(job.prompt)
        if tokens + sampling.max_tokens > config.context:
            asked = f"prompt ({tokens} tokens) plus max_tokens ({sampling.max_tokens})"
            raise ValueError(f"{asked} exceeds the context {config.context} (--context)")
        need = need_rows * self.sizes.row_bytes(tokens, sampling.max_tokens)
        if need > config.max_state_memory or need_rows > config.max_batch:
            raise ValueError(
                f"this request needs {need_rows} rows and {need} bytes of state; the server holds {config.max_batch} rows "
                f"and {config.max_state_memory} bytes (--max-batch, --max-state-memory): ask fewer tokens or choices"
            )
        with self.lock:
            if not self.accepting:
                raise Unavailable("the server is shutting down and takes no new requests")
            self.cache.evict_until(lambda cached: self.reserved + cached + need <= config.max_state_memory)
            if self.reserved + need > config.max_state_memory or self.rows + need_rows > config.max_batch:
                self.metrics.requests.labels("refused").inc()
                raise Busy(
                    f"the server is full ({self.rows} of {config.max_batch} rows, {self.reserved} of {config.max_state_memory} "
                    "state bytes reserved); retry shortly"
                )
            job.reserved, job.unfinished = need, need_rows
            self.reserved += need
            self.rows += need_rows
            self.waiting.append(job)
            self.unfinished.add(job)
            self.lock.notify()

    def drain(self) -> None:
        """Take no new requests (``Unavailable``); those already in finish."""
        with self.lock:
            self.accepting = False

    def idle(self) -> bool:
        """No request is waiting, reading its prompt or decoding."""
        with self.lock:
            return not self.unfinished

    def has_work(self) -> bool:
        """Something to do in an iteration (under the lock)."""
        return bool(self.waiting or self.prefills or self.cohorts)

    # -- the engine's thread ---------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """This iteration's plan (the bookkeeping of its joins and steps done here, the tensors' by the runner)."""
        self._drop_cancelled()
        with self.lock:  # the shortest first: its batch is padded to the longest, or the others read past it
            jobs = sorted(self.waiting, key=lambda job: len(job.prompt))
            self.waiting.clear()
        self.placement.admit(jobs, self.iterations)
        plan = StepPlan(self.iterations)
        landing: dict[int, list[Prefill]] = {}  # by cohort: the prefills that join it now
        for prefill in self.prefills:
            if prefill.done_iterations == prefill.plan.iterations:
                landing.setdefault(id(prefill.cohort), []).append(prefill)
        plan.joins = [join for join in map(self._join, landing.values()) if join is not None]
        plan.decodes = [decode for decode in map(self._decode, self.cohorts) if decode is not None]
        for prefill in self.prefills:
            size = prefill.next_chunk(self.config.chunk)
            prefill.done_iterations += 1
            if size and any(job.unfinished for job in prefill.jobs):
                plan.chunks.append(ChunkStep(prefill, size))
        return plan

    def update_from_output(self, plan: StepPlan, ended: list[SampledToken]) -> None:
        """After the plan ran and its tokens' events went out: the rows that ``ended`` leave, read prompts
        are cached, empty cohorts are dropped."""
        for item in ended:
            if item.row in item.cohort.rows:  # stopped by a stop string (one that reached max_tokens has left)
                self._leave(item.cohort, item.cohort.rows.index(item.row))
            self._row_done(item.row.job)
        if self.cache.min_tokens:
            for chunk in plan.chunks:
                if chunk.prefill.done():
                    self._remember(chunk.prefill)
        for cohort in [cohort for cohort in self.cohorts if not (cohort.alive() or cohort.joining)]:
            self._release(sum(cohort.holes.values()))
            self.cohorts.remove(cohort)
        self.iterations += 1

    def _join(self, prefills: list[Prefill]) -> JoinStep | None:
        """The rows of ``prefills``, done reading, join their cohort: into its holes, the rest appended."""
        cohort = prefills[0].cohort
        parts, rows = [], []
        for prefill in prefills:
            self.prefills.remove(prefill)
            cohort.joining -= len(prefill.jobs)
            if cohort.position != prefill.plan.position:  # pragma: no cover - the plan guarantees it
                raise RuntimeError(f"a prefill planned for position {prefill.plan.position} found its batch at {cohort.position}")
            self._settle_cancelled(prefill.jobs)
            index = []
            for member, (job, tail) in enumerate(zip(prefill.jobs, prefill.tails, strict=True)):
                if job.unfinished:
                    index += [member] * job.sampling.n
                    rows += [Row(job, choice, self.token_bytes, tail) for choice in range(job.sampling.n)]
            if index:  # each row once: the prefill's own state (nothing else holds it)
                parts.append((prefill, None if index == list(range(len(prefill.jobs))) else index))
        if not rows:
            return None
        reset = not cohort.alive()
        if reset:
            self._release(cohort.drop_holes())
        slots = sorted(cohort.holes)[: len(rows)]
        for slot, row in zip(slots, rows, strict=False):
            cohort.rows[slot] = row
        self._release(sum(cohort.holes.pop(slot) for slot in slots))
        cohort.rows += rows[len(slots) :]
        padding = self._pad(cohort) if len(rows) > len(slots) else 0  # where the state is made anew anyway
        return JoinStep(cohort, parts, slots, reset, padding)

    def _decode(self, cohort: Cohort) -> DecodeStep | None:
        """One step of every row of ``cohort``: tails read, rows sampling, those reaching ``max_tokens``
        leaving, the holes dropped where ``_compaction_due``."""
        cohort.position += 1
        alive = cohort.alive()
        if not alive:
            return None
        inputs, sampling = [0] * len(cohort.rows), []
        for slot in alive:
            row = cohort.rows[slot]
            if row.unread:
                inputs[slot] = row.unread.pop(0)
            else:
                sampling.append(slot)
        rows = [cohort.rows[slot] for slot in sampling]
        for slot, row in zip(sampling, rows, strict=True):
            if len(row.tokens) + 1 >= row.job.sampling.max_tokens:  # its last token
                self._leave(cohort, slot)
        keep, padding = None, 0
        if self.sizes.compaction_due(cohort):
            keep = cohort.alive() if len(cohort.alive()) < len(cohort.rows) else None
            self._release(cohort.drop_holes())
            padding = self._pad(cohort) if keep else 0
        sampled = set(map(id, rows))  # their coming token counts as sampled
        steps = [0 if row is None else row.steps_left() - (id(row) in sampled) for row in cohort.rows]
        return DecodeStep(cohort, inputs, sampling, rows, keep, steps, padding)

    def _pad(self, cohort: Cohort) -> int:
        """Spare rows (holes) after the cohort's rows, as many as ``StateSizes.spare_rows`` gives it beside the others'
        reservations: rows joining later take them in place, and the graph captured on the buffers stays. Their count."""
        rows, nbytes = len(cohort.rows), self.sizes.static_row
        with self.lock:
            padding = self.sizes.spare_rows(rows, self.config.max_batch, self.config.max_state_memory - self.reserved - self.cache.nbytes())
            self.reserved += padding * nbytes
        cohort.add_holes(padding, nbytes)
        return padding

    def _remember(self, prefill: Prefill) -> None:
        """Cache the prompts ``prefill`` read that are long enough."""
        for row, prompt in enumerate(prefill.prompts):
            if len(prompt) >= self.cache.min_tokens:
                state, logits = prefill.state.select([row]), prefill.logits[row : row + 1]
                with self.lock:
                    over = lambda cached: self.reserved + cached > self.config.max_state_memory  # noqa: E731
                    self.cache.remember(prompt, prefill.pads[row], state, logits, over)

    def _leave(self, cohort: Cohort, slot: int) -> None:
        """Row ``slot`` is done: a hole that keeps its bytes reserved until it is reused or dropped."""
        row = cohort.rows[slot]
        cohort.rows[slot], cohort.holes[slot] = None, row.nbytes
        with self.lock:
            self.reserved += row.nbytes

    def _release(self, nbytes: int) -> None:
        with self.lock:
            self.reserved -= nbytes

    def _row_done(self, job: Job, cancelled: bool = False) -> None:
        job.unfinished -= 1
        with self.lock:
            self.rows -= 1
            if job.unfinished == 0:
                self.reserved -= job.reserved
                self.unfinished.discard(job)
                self.metrics.requests.labels("cancelled" if cancelled else "completed").inc()
                if not cancelled and job.tokens > job.sampling.n and job.first_token is not None:
                    self.metrics.per_token.observe((time.monotonic() - job.first_token) / (job.tokens / job.sampling.n - 1))

    def _settle_cancelled(self, jobs) -> None:
        """Release the rows of the cancelled ones of ``jobs`` not yet released (``cancelled`` may turn
        true at any moment in another thread: each job is read once)."""
        for job in jobs:
            if job.cancelled:
                for _ in range(job.unfinished):
                    self._row_done(job, cancelled=True)

    def _drop_cancelled(self) -> None:
        with self.lock:
            gone = [job for job in self.waiting if job.cancelled]
            for job in gone:
                self.waiting.remove(job)
        self._settle_cancelled(gone)
        for prefill in self.prefills:
            self._settle_cancelled(prefill.jobs)
        for prefill in [prefill for prefill in self.prefills if all(job.unfinished == 0 for job in prefill.jobs)]:
            self.prefills.remove(prefill)
            prefill.cohort.joining -= len(prefill.jobs)
        for cohort in self.cohorts:
            for slot, row in enumerate(cohort.rows):
                if row is not None and row.job.cancelled:
                    self._leave(cohort, slot)
                    self._row_done(row.job, cancelled=True)

    def fail_all(self, message: str) -> None:
        """Every unanswered request gets ``Failed`` and its room back; the scheduler starts afresh."""
        self._release(sum(nbytes for cohort in self.cohorts for nbytes in cohort.holes.values()))
        self.cohorts.clear()
        self.prefills.clear()
        with self.lock:
            jobs, self.unfinished = list(self.unfinished), set()
            self.waiting.clear()
        for job in jobs:
            try:
                job.emit(Failed(message))
            except RuntimeError:  # its event loop is closed: the server is stopping
                pass
            with self.lock:
                self.rows -= job.unfinished
                self.reserved -= job.reserved
                job.unfinished = 0
                self.metrics.requests.labels("failed").inc()

    def load(self) -> tuple[int, int, int]:
        """Rows decoding, requests waiting or reading their prompt, and bytes the states and the cache hold."""
        states = [holder.state for holder in [*self.cohorts, *self.prefills] if holder.state is not None]
        with self.lock:
            cached = self.cache.nbytes()
        batch = sum(len(cohort.alive()) for cohort in self.cohorts)
        return batch, len(self.waiting) + len(self.prefills), sum(state.nbytes() for state in states) + cached
