"""Continuous batching over streaming states: the scheduler behind ``tokenmix serve``.

One thread owns the model. Each iteration it

1. drops the sequences whose client went away, and admits waiting requests: each is planned onto
   a batch (a *cohort*: rows sharing one streaming state at one position) where its prompt, padded
   in front, lands right-aligned (``plan.py``), or, where no padding can, lands with its last tokens
   still to read in the cohort (a tail), or starts a cohort of its own (padded to the longest
   recent prompt, so that prompts like it arriving later can join); a prompt that begins
   with a cached one resumes from that prompt's state (the prefix cache: exact, states are exact);
2. moves the prefills that are done into their cohort (``StreamState.concat``);
3. steps every cohort by one token for all its rows in one batched call, each row reading its tail's
   next token or sampling with its own settings and its own generator, row_generator(seed, choice), so that a request's tokens are
   those ``tokenmix.generate`` gives it alone with that seed; finished rows leave
   (``StreamState.select``);
4. feeds every prefill one chunk, so a long prompt never stalls the running rows for long.

Memory is admitted by the states' bytes (``StateSizes``): a request that would take the states past
the budget is refused (``Busy``: HTTP 429) rather than queued without bound.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import torch

from ..generation import choose_tokens, row_generator
from ..runtime import threads_within
from .metrics import ServeMetrics
from .plan import MAX_WAIT, PAD_FLOOR, JoinPlan, alone_plan, chunk_sizes, join_plan
from .text import CompletionText, token_text

BURST_QUIET, BURST_MAX = 0.002, 0.02  # seconds: an idle engine waits for the rest of a burst of requests (``_await_burst``)


class Busy(Exception):
    """The server has no room for the request now (HTTP 429); ``retry_after`` seconds is a fair wait."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(Exception):
    """The server is shutting down and takes no new requests (HTTP 503)."""


@dataclass(frozen=True)
class Sampling:
    """A request's generation settings (the OpenAI completions fields, validated by ``api.py``)."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    n: int = 1


@dataclass
class Token:
    """Event: choice ``choice`` got ``token``; ``text`` is what it makes final; ``logprobs`` when asked."""

    choice: int
    token: int
    text: str
    logprobs: dict | None = None


@dataclass
class Finished:
    """Event: choice ``choice`` ended ("stop" or "length"); ``text`` is what was still held back."""

    choice: int
    reason: str
    text: str


@dataclass
class Failed:
    """Event: the request failed inside the engine (its message is safe to show)."""

    message: str


@dataclass(eq=False)  # a job is itself, not its fields: the engine keeps a set of them
class Job:
    """A request inside the engine: its prompt ids, settings, and where its events go (``emit`` is
    called from the engine's thread)."""

    prompt: list[int]
    sampling: Sampling
    emit: Callable[[object], None]
    cancelled: bool = False
    reserved: int = 0
    unfinished: int = 0
    arrived: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    tokens: int = 0

    def cancel(self) -> None:
        """The client went away: its sequences leave at the next iteration."""
        self.cancelled = True


class Row:
    """One choice of a job decoding in a cohort; ``nbytes``: its share of the job's reservation; ``unread``:
    the prompt's tokens it still reads in the cohort, one per step, before it samples (a plan's tail)."""

    def __init__(self, job: Job, choice: int, token_bytes: list[bytes], unread: tuple = ()):
        self.job, self.choice, self.nbytes = job, choice, job.reserved // job.sampling.n
        self.generator = row_generator(job.sampling.seed, choice)
        self.tokens: list[int] = []
        self.unread = list(unread)
        self.text = CompletionText(token_bytes, list(job.sampling.stop))

    def steps_left(self) -> int:
        """Model steps whose outputs this row may still use (at most: a stop may end it sooner): one per
        prompt token it has yet to read and per token it has yet to sample, the coming step included."""
        return len(self.unread) + self.job.sampling.max_tokens - len(self.tokens)


@dataclass
class Cohort:
    """Rows sharing one state at ``position`` (the position it would have when empty and awaited).

    Removing or adding rows by ``select`` / ``concat`` copies the whole state, which for a Toeplitz
    model holds every past input: many decoding steps' time. So a finished row leaves a hole (its
    ``holes`` entry: the bytes it keeps reserved), stepped with token 0, and a joining row takes a
    hole in place (``StreamState.assign``); the holes are dropped at once when they are three quarters
    of the batch (stepping a hole costs far less than copying the state), or a quarter of the batch's
    live rows where the state grows (``StateSizes.grows_at``): that step copies every row anyway, and
    a Toeplitz state's also adds its largest block of inputs to the outputs ahead (up to the furthest
    row's end: every step tells the state where its rows end, ``StreamState.limit_steps``): the cost
    of dozens of plain steps, for every row, holes included.
    """

    position: int
    rows: list = field(default_factory=list)
    state: object = None
    logits: torch.Tensor | None = None  # (rows, vocab): each row's next-token logits
    joining: int = 0  # requests whose prefills are planned to land here
    holes: dict = field(default_factory=dict)  # slot -> bytes it keeps reserved

    def alive(self) -> list[int]:
        return [index for index, row in enumerate(self.rows) if row is not None]

    def life(self) -> int:
        """Iterations until its last row ends (at most: a stop may end a row sooner)."""
        return max((row.steps_left() for row in self.rows if row is not None), default=0)


@dataclass
class Prefill:
    """Prompts read together, one chunk per iteration, towards the position where they join ``cohort``.

    New prompts that land on the same cohort at the same position join a prefill that has not read
    anything yet, whenever they were planned: one batch, right-aligned by their padding, each row
    ``plan.position`` tokens long (``plan.pads`` is the first row's); a prompt's tail, past that
    position, is read in the cohort. A prompt resumed from the prefix cache reads alone, from the
    cached state.
    """

    jobs: list
    prompts: list  # each job's prompt ids read here (the prefix cache's keys)
    pads: list  # each row's padding: in ``tokens`` (new prompts), or already in the cached state
    cohort: Cohort
    plan: JoinPlan
    tokens: list  # each row's ids still to read, its padding first
    tails: list  # each job's prompt ids left to read in the cohort
    resumed: bool = False
    state: object = None  # made at the first chunk, for every row (a resumed prompt: the cached state)
    logits: torch.Tensor | None = None  # (rows, vocab) after the last chunk (or the cached prompt's)
    fed: int = 0
    done_iterations: int = 0

    def add(self, job: Job, prompt: tuple, pads: int, tail: int) -> None:
        read = len(prompt) - tail
        self.jobs.append(job)
        self.prompts.append(prompt[:read])
        self.pads.append(pads)
        self.tokens.append([0] * pads + list(prompt[:read]))
        self.tails.append(prompt[read:])

    def unread(self) -> int:
        """Where reading resumes: before the first chunk, past the padding every row has, which the state
        starts after without reading it (``init_state(masked=...)``)."""
        return self.fed if self.state is not None else min(self.pads)

    def next_chunk(self, chunk: int) -> int:
        """Tokens to read this iteration (``chunk_sizes`` of what is left)."""
        return chunk_sizes(len(self.tokens[0]) - self.unread(), chunk, self.plan.iterations - self.done_iterations)[0]


@dataclass
class CachedPrompt:
    """A prompt's state and last logits, kept for requests that start with it."""

    pads: int
    state: object
    logits: torch.Tensor
    nbytes: int


class PhaseClock:
    """Adds the time since its last lap to ``counter`` under a phase label, one of ``ENGINE_PHASES``
    (``ServeMetrics.engine_seconds``)."""

    def __init__(self, counter):
        self.counter, self.last = counter, time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.counter.labels(phase).inc(now - self.last)
        self.last = now


class StateSizes:
    """Bytes one row's state holds at a position, measured once on the model itself: a row streamed
    to each power of two up to ``context`` (each bound holds every position below it, capacity and
    cache growth included)."""

    def __init__(self, model, context: int, device):
        self.bounds: list[tuple[int, int]] = []
        length = 1
        with torch.no_grad():
            while True:
                length = min(length, context)
                state = model.init_state(1, max_length=context, device=device)
                _, state = model(torch.zeros(1, length, dtype=torch.long, device=device), state=state, return_state=True)
                self.bounds.append((length, state.nbytes()))
                if length == context:
                    break
                length *= 2

    def at(self, position: int) -> int:
        """Bytes of one row up to ``position`` (at most the context)."""
        return next((size for bound, size in self.bounds if bound >= position), self.bounds[-1][1])

    def grows_at(self, position: int) -> bool:
        """Whether a state reaching ``position`` grows there: a bound holding more bytes than the one before
        (a Toeplitz state doubles its history on the step to each power of two; a fixed-size state never grows)."""
        return any(bound == position and size > before for (_, before), (bound, size) in pairwise(self.bounds))


class Engine:
    """The scheduler: ``submit`` jobs from any thread; ``run`` (in one thread) serves them.

    ``context``: the longest stream (prompt, padding and completion) a row may reach; every state is
    made for it, so a request's tokens are those of ``tokenmix.generate(..., max_length=context)``.
    ``max_batch``: rows at most (choices of running and reading requests); ``max_state_memory``:
    bytes the states and the prefix cache may hold; ``chunk``: prompt tokens a prefill reads per
    iteration; ``prefix_min``: prompts at least this long are cached for reuse (0: no cache);
    ``prefill_threads``: torch's threads while a prefill reads its chunk (None: those of the steps).
    """

    def __init__(
        self,
        model,
        token_bytes: list[bytes],
        *,
        context: int,
        max_batch: int,
        max_state_memory: int,
        chunk: int = 512,
        prefix_min: int = 64,
        prefix_entries: int = 16,
        prefill_threads: int | None = None,
    ):
        self.model, self.token_bytes = model.eval(), token_bytes
        self.prefill_threads = prefill_threads
        self.context, self.max_batch, self.budget, self.chunk = context, max_batch, max_state_memory, chunk
        self.prefix_min, self.prefix_entries = prefix_min, prefix_entries
        self.device = next(model.parameters()).device
        self.period = model.front_padding_period
        self.sizes = StateSizes(model, context, self.device)
        self.lock = threading.Condition()
        self.waiting: deque[Job] = deque()
        self.prefills: list[Prefill] = []
        self.cohorts: list[Cohort] = []
        self.cache: OrderedDict[tuple, CachedPrompt] = OrderedDict()
        self.reserved = self.rows = 0
        self.accepting, self.stopped = True, False
        self.iterations = 0
        self.recent_prompts: deque[int] = deque(maxlen=max_batch)  # the lengths of the last prompts admitted
        self.unfinished: set[Job] = set()  # admitted and not yet answered in full: what a failure must reach
        self.metrics = ServeMetrics()

    # -- any thread ------------------------------------------------------------------------------
    def row_bytes(self, prompt: int, max_tokens: int) -> int:
        """The most a row of this prompt and completion may hold, whatever padding it is given."""
        padded = prompt + max_tokens + max(PAD_FLOOR, prompt + max_tokens)
        return self.sizes.at(min(padded, self.context))

    def submit(self, job: Job) -> None:
        """Queue ``job``, or raise ``Busy`` (no room now) / ``Unavailable`` (shutting down) / ValueError
        (it could never fit: the request asks more than the server's limits)."""
        sampling, need_rows = job.sampling, job.sampling.n
        if len(job.prompt) + sampling.max_tokens > self.context:
            raise ValueError(
                f"prompt ({len(job.prompt)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the context {self.context} (--context)"
            )
        need = need_rows * self.row_bytes(len(job.prompt), sampling.max_tokens)
        if need > self.budget or need_rows > self.max_batch:
            raise ValueError(
                f"this request needs {need_rows} rows and {need} bytes of state; the server holds {self.max_batch} rows "
                f"and {self.budget} bytes (--max-batch, --max-state-memory): ask fewer tokens or choices"
            )
        with self.lock:
            if not self.accepting:
                raise Unavailable("the server is shutting down and takes no new requests")
            while self.cache and self.reserved + self._cached_bytes() + need > self.budget:
                self.cache.popitem(last=False)  # the least recently used prompt makes room
            if self.reserved + need > self.budget or self.rows + need_rows > self.max_batch:
                self.metrics.requests.labels("refused").inc()
                raise Busy(
                    f"the server is full ({self.rows} of {self.max_batch} rows, {self.reserved} of {self.budget} state bytes "
                    "reserved); retry shortly"
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

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify()

    # -- the engine's thread ---------------------------------------------------------------------
    def run(self, after_iteration: Callable[[], None] | None = None) -> None:
        """Serve until ``stop``: one iteration whenever there is work, asleep otherwise; ``after_iteration``
        is called after each (the engine's process sends the iteration's events then)."""
        while True:
            with self.lock:
                if not (self.waiting or self.prefills or self.cohorts):  # idle: wait for a request, then for the rest of its burst
                    while not self.stopped and not self.waiting:
                        self.lock.wait()
                    self._await_burst()
                if self.stopped:
                    return
            try:
                with torch.no_grad():
                    self.iteration()
            except Exception as error:  # noqa: BLE001 - every running request learns of it; the server goes on
                self._fail_all(f"the model failed: {type(error).__name__}: {error}")
            if after_iteration is not None:
                after_iteration()

    def _await_burst(self) -> None:
        """Under the lock, on an idle engine that just got a request: wait while more keep coming (each within
        ``BURST_QUIET`` seconds of the last, for at most ``BURST_MAX``), so that requests sent together are
        read as one batch (a first request read alone makes the rest join it: a copy of the batch's state)."""
        deadline = time.monotonic() + BURST_MAX
        while not self.stopped:
            seen = len(self.waiting)
            self.lock.wait(min(BURST_QUIET, max(0.0, deadline - time.monotonic())))
            if len(self.waiting) == seen or time.monotonic() >= deadline:
                return

    def iteration(self) -> None:
        clock = PhaseClock(self.metrics.engine_seconds)
        self._drop_cancelled()
        self._admit()
        clock.lap("schedule")
        landing: dict[int, list[Prefill]] = {}  # by cohort: the prefills that join it now
        for prefill in self.prefills:
            if prefill.done_iterations == prefill.plan.iterations:
                landing.setdefault(id(prefill.cohort), []).append(prefill)
        for prefills in landing.values():
            self._join(prefills)
        clock.lap("join")
        made = 0
        for cohort in self.cohorts:
            made += self._decode(cohort)
        clock.lap("decode")
        for prefill in self.prefills:
            self._feed(prefill)
        clock.lap("prefill")
        for cohort in [cohort for cohort in self.cohorts if not (cohort.alive() or cohort.joining)]:
            self._compact(cohort)
            self.cohorts.remove(cohort)
        self.iterations += 1
        self._update_gauges(made)
        clock.lap("schedule")

    def _admit(self) -> None:
        with self.lock:
            # the shortest first: its batch is padded to the longest (``_starting_pads``), or the others read past it
            jobs = sorted(self.waiting, key=lambda job: len(job.prompt))
            self.waiting.clear()
        self.recent_prompts.extend(len(job.prompt) for job in jobs)
        for job in jobs:
            self.metrics.prompt_tokens.inc(len(job.prompt))
            self._plan(job)

    def _plan(self, job: Job) -> None:
        prompt = tuple(job.prompt)
        sampling = job.sampling
        room = max(PAD_FLOOR, len(prompt) + sampling.max_tokens)  # the padding its reservation allows

        def resumable(key: tuple) -> bool:
            entry = self.cache[key]
            fits = entry.pads <= room and entry.pads + len(prompt) + sampling.max_tokens <= self.context
            return fits and len(key) <= len(prompt) and prompt[: len(key)] == key

        with self.lock:  # ``submit`` evicts from the cache in the HTTP threads
            cached_key = max(filter(resumable, self.cache), key=len, default=None)
            if cached_key is not None:
                cached = self.cache[cached_key]
                self.cache.move_to_end(cached_key)
        if cached_key is not None:
            start = cached.pads + len(cached_key)
            landing = self._landing(start, len(prompt) - len(cached_key), sampling)
            if landing is None and len(cached_key) < self.chunk:
                cached_key = None  # it would start a batch at its own position to save less than one chunk of reading
        if cached_key is None:
            start, landing = 0, self._landing(0, len(prompt), sampling)
        else:
            self.metrics.prefix_hits.inc()
        remaining = prompt[len(cached_key or ()) :]
        if landing is not None:
            cohort, plan = landing
        else:
            plan = alone_plan(start, len(remaining), self.chunk, 0 if cached_key else self._starting_pads(len(prompt), sampling))
            cohort = Cohort(plan.position - plan.iterations)
            self.cohorts.append(cohort)
        cohort.joining += 1
        if cached_key is None:  # a new prompt joins the unstarted prefill landing alike: one batch, read and joined once
            alike = (prefill for prefill in self._unstarted(cohort) if prefill.plan.position == plan.position)
            prefill = next(alike, None)
            if prefill is not None:
                prefill.add(job, prompt, plan.pads, plan.tail)
                return
        prefill = Prefill([], [], [], cohort, plan, [], [])
        if cached_key is None:
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
        room = min(max(PAD_FLOOR, tokens + sampling.max_tokens), self.context - sampling.max_tokens - tokens)
        pads = min(max(self.recent_prompts, default=0) - tokens, room)
        return max(0, pads - pads % self.period)

    def _landing(self, start: int, tokens: int, sampling: Sampling) -> tuple[Cohort, JoinPlan] | None:
        """The running batch a stream at ``start`` with ``tokens`` prompt tokens to read joins, and how; None
        when it joins none (``join_plan``), or none long enough to share ``min(max_tokens, MAX_WAIT)``
        steps with it (worth its padding) past its tail (a tail read by a row left alone costs a step per
        token). Of those it can join, the fullest, then the soonest."""
        limits = (self.chunk, self.period, sampling.max_tokens, self.context, self.iterations)
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

    def _feed(self, prefill: Prefill) -> None:
        size = prefill.next_chunk(self.chunk)
        prefill.done_iterations += 1
        if size == 0 or all(job.unfinished == 0 for job in prefill.jobs):
            return
        rows = len(prefill.jobs)
        if prefill.state is None:
            prefill.fed = prefill.unread()
            prefill.state = self.model.init_state(rows, max_length=self.context, device=self.device, masked=prefill.fed)
        part = slice(prefill.fed, prefill.fed + size)
        tokens = torch.tensor([row[part] for row in prefill.tokens], dtype=torch.long, device=self.device)
        mask = None
        if not prefill.resumed and any(pads > prefill.fed for pads in prefill.pads):
            positions = torch.arange(prefill.fed, prefill.fed + size, device=self.device)
            mask = positions[None] >= torch.tensor(prefill.pads, device=self.device)[:, None]
        with threads_within(self.prefill_threads):
            logits, prefill.state = self.model(tokens, mask, state=prefill.state, return_state=True)
        prefill.logits, prefill.fed = logits[:, -1].clone(), prefill.fed + size  # not a view keeping the chunk's logits
        if prefill.fed == len(prefill.tokens[0]) and self.prefix_min:
            for row, prompt in enumerate(prefill.prompts):
                if len(prompt) >= self.prefix_min:
                    self._remember(prompt, prefill.pads[row], prefill.state.select([row]), prefill.logits[row : row + 1])

    def _remember(self, prompt: tuple, pads: int, state, logits: torch.Tensor) -> None:
        """Keep a prompt's state for later requests that start with it, while memory allows."""
        entry = CachedPrompt(pads, state, logits, state.nbytes())
        with self.lock:
            self.cache.pop(prompt, None)
            while self.cache and (len(self.cache) >= self.prefix_entries or self._over_budget(entry.nbytes)):
                self.cache.popitem(last=False)
            if not self._over_budget(entry.nbytes):
                self.cache[prompt] = entry

    def _over_budget(self, extra: int) -> bool:  # under the lock, as every reader of the cache
        return self.reserved + self._cached_bytes() + extra > self.budget

    def _cached_bytes(self) -> int:
        return sum(entry.nbytes for entry in self.cache.values())

    def _join(self, prefills: list[Prefill]) -> None:
        """The rows of ``prefills``, done reading, join their cohort: into its holes in place, the rest
        appended by one ``concat`` (a copy of the cohort's whole state, once for all of them)."""
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
            if index == list(range(len(prefill.jobs))):  # each row once: the prefill's own state (nothing else holds it)
                parts.append((prefill.state, prefill.logits))
            elif index:
                parts.append((prefill.state.select(index), prefill.logits[index]))
        if not rows:
            return
        state = parts[0][0] if len(parts) == 1 else type(parts[0][0]).concat([part for part, _ in parts])
        logits = torch.cat([part for _, part in parts])
        if not cohort.alive():
            self._compact(cohort)
        slots = sorted(cohort.holes)[: len(rows)]
        if slots:  # into holes, in place
            cohort.state = cohort.state.assign(slots, state.select(list(range(len(slots)))))
            cohort.logits[slots] = logits[: len(slots)]
            for slot, row in zip(slots, rows, strict=False):
                cohort.rows[slot] = row
            self._release(sum(cohort.holes.pop(slot) for slot in slots))
            state, logits, rows = state.select(list(range(len(slots), len(rows)))), logits[len(slots) :], rows[len(slots) :]
        if rows and cohort.rows:
            cohort.state = type(state).concat([cohort.state, state])
            cohort.logits = torch.cat([cohort.logits, logits])
        elif rows:
            cohort.state, cohort.logits = state, logits
        cohort.rows += rows

    def _leave(self, cohort: Cohort, slot: int) -> None:
        """Row ``slot`` is done: a hole that keeps its bytes reserved until it is reused or dropped."""
        row = cohort.rows[slot]
        cohort.rows[slot], cohort.holes[slot] = None, row.nbytes
        with self.lock:
            self.reserved += row.nbytes

    def _compact(self, cohort: Cohort) -> None:
        """Drop the holes (one ``select`` of the state)."""
        alive = cohort.alive()
        if len(alive) < len(cohort.rows):
            cohort.rows = [cohort.rows[index] for index in alive]
            cohort.state = cohort.state.select(alive) if alive else None
            cohort.logits = cohort.logits[alive] if alive else None
        self._release(sum(cohort.holes.values()))
        cohort.holes = {}

    def _release(self, nbytes: int) -> None:
        with self.lock:
            self.reserved -= nbytes

    def _decode(self, cohort: Cohort) -> int:
        """One step of every row of ``cohort``: a row still reading its prompt takes its next token, the
        others a token each (returns how many were made)."""
        cohort.position += 1
        alive = cohort.alive()
        if not alive:
            return 0
        inputs = [0] * len(cohort.rows)
        sampled = []  # the slots of the rows that sample now
        for slot in alive:
            row = cohort.rows[slot]
            if row.unread:
                inputs[slot] = row.unread.pop(0)
            else:
                sampled.append(slot)
        rows = [cohort.rows[slot] for slot in sampled]
        logits = cohort.logits[sampled] if len(sampled) < len(cohort.rows) else cohort.logits
        picks = self._choose(logits, rows)
        wanted = [index for index, row in enumerate(rows) if row.job.sampling.logprobs is not None]
        logprobs = dict(zip(wanted, self._logprobs(logits[wanted], [picks[i] for i in wanted], rows, wanted), strict=True))
        now = time.monotonic()
        for index, slot, row, token in zip(range(len(rows)), sampled, rows, picks, strict=True):
            job = row.job
            if job.first_token is None:
                job.first_token = now
                self.metrics.first_token.observe(now - job.arrived)
            row.tokens.append(token)
            job.tokens += 1
            if index in logprobs:  # where the token's text begins in the completion's (characters)
                logprobs[index]["offset"] = len(row.text.raw.decode("utf-8", errors="replace"))
            job.emit(Token(row.choice, token, row.text.add(token), logprobs.get(index)))
            reason = "stop" if row.text.stopped else "length" if len(row.tokens) >= job.sampling.max_tokens else None
            inputs[slot] = token
            if reason is not None:
                job.emit(Finished(row.choice, reason, row.text.finish()))
                self._leave(cohort, slot)
                self._row_done(job)
        outgrown = any(nbytes < self.sizes.at(cohort.position + 1) for nbytes in cohort.holes.values())  # past their reservation
        holes = len(cohort.holes)
        if (
            outgrown
            or 4 * holes >= 3 * len(cohort.rows)
            or (self.sizes.grows_at(cohort.position) and 4 * holes >= len(cohort.rows) - holes)
        ):
            inputs = [inputs[index] for index in cohort.alive()]
            self._compact(cohort)
        if cohort.rows:
            steps = torch.tensor([0 if row is None else row.steps_left() for row in cohort.rows])  # holes: none
            state = cohort.state.limit_steps(steps)
            logits, cohort.state = self.model(torch.tensor(inputs, device=self.device)[:, None], state=state, return_state=True)
            cohort.logits = logits[:, -1]
        return len(rows)

    def _choose(self, logits: torch.Tensor, rows: list[Row]) -> list[int]:
        """Each row's next token, rows of the same settings drawn together (``choose_tokens``)."""
        groups: dict[tuple, list[int]] = {}
        for index, row in enumerate(rows):
            sampling = row.job.sampling
            groups.setdefault((sampling.temperature, sampling.top_k, sampling.top_p), []).append(index)
        picks = [0] * len(rows)
        for (temperature, top_k, top_p), members in groups.items():
            chosen = choose_tokens(logits[members], temperature, top_k, top_p, [rows[index].generator for index in members])
            for index, token in zip(members, chosen.tolist(), strict=True):
                picks[index] = token
        return picks

    def _logprobs(self, logits: torch.Tensor, picks: list[int], rows: list[Row], members: list[int]) -> list[dict]:
        """The model's log-probability of each chosen token and of its ``logprobs`` most likely ones."""
        if not members:
            return []
        logprobs = logits.float().log_softmax(dim=-1).cpu()
        found = []
        for line, pick, index in zip(logprobs, picks, members, strict=True):
            values, ids = line.topk(min(rows[index].job.sampling.logprobs, line.numel()))
            top = {token_text(self.token_bytes[i]): value for value, i in zip(values.tolist(), ids.tolist(), strict=True)}
            found.append({"token": token_text(self.token_bytes[pick]), "logprob": float(line[pick]), "top": top})
        return found

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

    def _fail_all(self, message: str) -> None:
        """Every unanswered request gets ``Failed`` and its room back; the engine starts afresh."""
        self._release(sum(nbytes for cohort in self.cohorts for nbytes in cohort.holes.values()))
        self.cohorts, self.prefills = [], []
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

    def _update_gauges(self, made: int) -> None:
        metrics = self.metrics
        metrics.made(made)
        metrics.batch_size.set(sum(len(cohort.alive()) for cohort in self.cohorts))
        metrics.queue.set(len(self.waiting) + len(self.prefills))
        states = [holder.state for holder in [*self.cohorts, *self.prefills] if holder.state is not None]
        with self.lock:
            cached = self._cached_bytes()
        metrics.held(sum(state.nbytes() for state in states) + cached)
