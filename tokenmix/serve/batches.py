"""What the scheduler arranges: a job's choices as ``Row`` s, rows sharing one streaming state as a
``Cohort``, and prompts read together towards a cohort as a ``Prefill``.

The scheduler keeps the bookkeeping (which row sits in which slot, the holes, the positions); the
model runner keeps the tensors beside it (``state``, ``logits``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..generation import row_generator
from .jobs import Job
from .joining import JoinPlan, chunk_sizes
from .text import CompletionText


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
    hole in place (``StreamState.assign``); the holes are dropped (``Scheduler`` decides when) by one
    ``select``.
    """

    position: int
    rows: list = field(default_factory=list)
    state: object = None
    logits: torch.Tensor | None = None  # (rows, vocab): each row's next-token logits
    joining: int = 0  # requests whose prefills are planned to land here
    holes: dict = field(default_factory=dict)  # slot -> bytes it keeps reserved
    graph: object = None  # static decoding on CUDA: the model runner's CUDA graph of its step (``StepGraph``)

    def alive(self) -> list[int]:
        return [index for index, row in enumerate(self.rows) if row is not None]

    def add_holes(self, count: int, nbytes: int) -> None:
        """``count`` holes after the rows, each keeping ``nbytes`` reserved (spare rows of static buffers)."""
        self.holes.update(dict.fromkeys(range(len(self.rows), len(self.rows) + count), nbytes))
        self.rows += [None] * count

    def drop_holes(self) -> int:
        """Drop the holes from the bookkeeping (the model runner drops them from the state); the bytes they kept."""
        self.rows = [row for row in self.rows if row is not None]
        kept, self.holes = sum(self.holes.values()), {}
        return kept

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

    def done(self) -> bool:
        """Every row's prompt is read (up to its tail)."""
        return self.fed == len(self.tokens[0])
