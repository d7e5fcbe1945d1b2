"""The model runner: executes a ``StepPlan`` on the model, the only part of the engine that touches its
tensors (the cohorts' and prefills' states and logits).

With static decoding (``EngineConfig.decoding``, ``tokenmix.generation.graphs``) a cohort's state is held in
static buffers from the moment its rows join it (prefills read as streams): on CUDA each cohort's step is a
CUDA graph captured on its buffers, again only when they change (rows dropped or appended past the spare rows
its buffers were made with, ``graph_batch``; a join into holes or spare rows writes in place); the cohorts' graphs
share one memory pool (``StepGraph``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..generation.graphs import StepGraph, use_static_decoding
from ..runtime import threads_within
from .config import EngineConfig
from .sampler import Sampler
from .step import ChunkStep, DecodeStep, JoinStep, ModelOutput, SampledToken, StepPlan


class ModelRunner:
    """Runs ``model`` for the scheduler's plans: joins read prompts into their cohorts' states, steps every
    cohort by one token (its next tokens drawn by ``sampler``), reads prompt chunks (with ``prefill_threads``
    torch threads)."""

    def __init__(self, model, sampler: Sampler, config: EngineConfig):
        self.model, self.sampler = model.eval(), sampler
        self.context, self.prefill_threads = config.context, config.prefill_threads
        self.device = next(model.parameters()).device
        self.static = use_static_decoding(model, config.decoding, self.device)
        self.graph_pool = torch.cuda.graph_pool_handle() if self.static and self.device.type == "cuda" else None

    def execute(self, plan: StepPlan, lap: Callable[[str], None] = lambda phase: None) -> ModelOutput:
        """The plan's joins, decoding steps and chunks, in that order (``lap`` marks the end of each phase)."""
        for join in plan.joins:
            self.join(join)
        lap("join")
        output = ModelOutput()
        for decode in plan.decodes:
            output.sampled += self.decode(decode)
        lap("decode")
        for chunk in plan.chunks:
            self.read(chunk)
        lap("prefill")
        return output

    def join(self, step: JoinStep) -> None:
        """The rows of the step's prefills into the cohort's holes in place (``StreamState.assign``), the rest
        appended by one ``concat`` (a copy of the cohort's whole state, once for all of them)."""
        parts = []
        for prefill, rows in step.parts:
            parts.append((prefill.state, prefill.logits) if rows is None else (prefill.state.select(rows), prefill.logits[rows]))
        state = parts[0][0] if len(parts) == 1 else type(parts[0][0]).concat([part for part, _ in parts])
        if self.static:
            state = self.model.static_state(state, self.context)
        logits = torch.cat([part for _, part in parts])
        cohort = step.cohort
        if step.reset:
            cohort.state = cohort.logits = cohort.graph = None
        taken = len(step.slots)
        if taken:
            cohort.state = cohort.state.assign(step.slots, state.select(list(range(taken))))
            cohort.logits[step.slots] = logits[:taken]
        if taken or step.padding:  # the rows appended, then spare copies of the first of them (never read)
            appended = list(range(taken, len(logits)))
            appended += appended[:1] * step.padding
            state, logits = state.select(appended), logits[appended]
        if len(logits) and cohort.state is not None:
            cohort.state = type(state).concat([cohort.state, state])
            cohort.logits = torch.cat([cohort.logits, logits])
        elif len(logits):
            cohort.state, cohort.logits = state, logits

    def decode(self, step: DecodeStep) -> list[SampledToken]:
        """The sampling rows' next tokens, then one model step of the cohort's rows (after dropping its
        holes where the plan says so)."""
        cohort, inputs = step.cohort, list(step.inputs)
        logits = cohort.logits[step.sampling] if len(step.sampling) < len(cohort.logits) else cohort.logits
        picks, logprobs = self.sampler.sample(logits, step.rows)
        for slot, token in zip(step.sampling, picks, strict=True):
            inputs[slot] = token
        if step.keep is not None:
            keep = step.keep + step.keep[:1] * step.padding  # spare rows: copies of the first (never read)
            inputs = [inputs[index] for index in keep]
            cohort.state, cohort.graph = cohort.state.select(keep) if keep else None, None  # the graph's buffers go
            cohort.logits = cohort.logits[keep] if keep else None
        if inputs and self.static:
            cohort.logits = self.static_step(cohort, torch.tensor(inputs, device=self.device))
        elif inputs:
            state = cohort.state.limit_steps(torch.tensor(step.steps))
            logits, cohort.state = self.model(torch.tensor(inputs, device=self.device)[:, None], state=state, return_state=True)
            cohort.logits = logits[:, -1]
        return [SampledToken(cohort, *sampled) for sampled in zip(step.rows, picks, logprobs, strict=True)]

    def static_step(self, cohort, tokens: torch.Tensor) -> torch.Tensor:
        """The cohort's next logits from its static buffers: on CUDA a replay of its graph, captured again where its
        buffers changed; elsewhere the static step run eagerly."""
        if self.device.type != "cuda":
            return self.model.static_step(tokens[:, None], cohort.state)
        if cohort.graph is None or not cohort.graph.captured_on(cohort.state):
            cohort.graph = None  # the old graph's logits go back to the pool first
            cohort.graph = StepGraph(self.model, cohort.state, self.graph_pool)
        return cohort.graph.step(tokens)

    def read(self, step: ChunkStep) -> None:
        """The prefill's next chunk: its first makes the state (past the padding every row has), a new
        prompt's rows mask their own padding."""
        prefill, size = step.prefill, step.size
        if prefill.state is None:
            prefill.fed = prefill.unread()
            prefill.state = self.model.init_state(len(prefill.jobs), max_length=self.context, device=self.device, masked=prefill.fed)
        part = slice(prefill.fed, prefill.fed + size)
        tokens = torch.tensor([row[part] for row in prefill.tokens], dtype=torch.long, device=self.device)
        mask = None
        if not prefill.resumed and any(pads > prefill.fed for pads in prefill.pads):
            positions = torch.arange(prefill.fed, prefill.fed + size, device=self.device)
            mask = positions[None] >= torch.tensor(prefill.pads, device=self.device)[:, None]
        with threads_within(self.prefill_threads):
            logits, prefill.state = self.model(tokens, mask, state=prefill.state, return_state=True)
        prefill.logits, prefill.fed = logits[:, -1].clone(), prefill.fed + size  # not a view keeping the chunk's logits
