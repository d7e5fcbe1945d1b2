"""What one engine iteration does, as plain data: the scheduler's ``StepPlan`` and the model runner's
``ModelOutput`` (vLLM v1's ``SchedulerOutput`` and ``ModelRunnerOutput``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .batches import Cohort, Prefill, Row


@dataclass
class JoinStep:
    """Prefills done reading join ``cohort``: of each, the rows of its state in ``parts`` (a prefill and the
    rows it gives, None: all, once each), the first of them into the holes ``slots`` in place, the rest
    appended by one ``concat`` with ``padding`` spare rows after them (static decoding: ``graph_batch``);
    ``reset``: the cohort had no live row left, its state is dropped first."""

    cohort: Cohort
    parts: list[tuple[Prefill, list[int] | None]]
    slots: list[int]
    reset: bool = False
    padding: int = 0


@dataclass
class DecodeStep:
    """One step of every row of ``cohort``: a row still reading its prompt takes its next token (in
    ``inputs``), the rows at ``sampling`` (``rows``) sample theirs from the logits of the last step; then,
    where ``keep`` is given, the state keeps only those rows (the holes are dropped) and ``padding`` spare rows
    after them, and the rows left are stepped, each told its ``steps`` left (``StreamState.limit_steps``)."""

    cohort: Cohort
    inputs: list[int]
    sampling: list[int]
    rows: list[Row]
    keep: list[int] | None
    steps: list[int]
    padding: int = 0


@dataclass
class ChunkStep:
    """``prefill`` reads its next ``size`` tokens."""

    prefill: Prefill
    size: int


@dataclass
class StepPlan:
    """An iteration's work, in the order it is done: the joins, the decoding steps, the prompt chunks."""

    iteration: int
    joins: list[JoinStep] = field(default_factory=list)
    decodes: list[DecodeStep] = field(default_factory=list)
    chunks: list[ChunkStep] = field(default_factory=list)


@dataclass
class SampledToken:
    """A token sampled for ``row`` of ``cohort`` (with its ``logprobs`` where its request asks them)."""

    cohort: Cohort
    row: Row
    token: int
    logprobs: dict | None = None


@dataclass
class ModelOutput:
    """What the model runner made of a plan: every sampled token, in the plan's order."""

    sampled: list[SampledToken] = field(default_factory=list)
