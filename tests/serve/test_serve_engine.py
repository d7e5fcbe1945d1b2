"""The serving scheduler without HTTP: continuous batching gives every request what ``tokenmix.generate``
gives it alone, over every causal model; the join plan, the completion text, admission and the prefix cache."""

from __future__ import annotations

import threading
from unittest.mock import patch

import pytest

pytest.importorskip("prometheus_client", reason='the server needs its extra: pip install "tokenmix[serve]"')

import torch  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_contracts import LM_MODELS, model  # noqa: E402

import tokenmix  # noqa: E402
from tokenmix.runtime import threads_within  # noqa: E402
from tokenmix.serve import ENGINE_PHASES  # noqa: E402
from tokenmix.serve import engine as engine_module  # noqa: E402
from tokenmix.serve.config import EngineConfig  # noqa: E402
from tokenmix.serve.engine import Engine  # noqa: E402
from tokenmix.serve.jobs import Busy, Failed, Finished, Job, Sampling, Token  # noqa: E402
from tokenmix.serve.joining import JOIN_EVERY, MAX_TAIL, MAX_WAIT, PAD_FLOOR, JoinPlan, chunk_sizes, join_plan  # noqa: E402
from tokenmix.serve.text import CompletionText  # noqa: E402

TOKEN_BYTES = [bytes([byte]) for byte in range(20)]  # the test models' 20 ids as bytes
CONTEXT = 160


class Collected:
    """A job's events: each choice's tokens and text, and whether every choice finished."""

    def __init__(self, sampling: Sampling):
        self.tokens = {choice: [] for choice in range(sampling.n)}
        self.text = {choice: "" for choice in range(sampling.n)}
        self.reasons, self.failed, self.done = {}, None, threading.Event()

    def __call__(self, event) -> None:
        if isinstance(event, Token):
            self.tokens[event.choice].append(event.token)
        if isinstance(event, (Token, Finished)):
            self.text[event.choice] += event.text
        if isinstance(event, Finished):
            self.reasons[event.choice] = event.reason
        if isinstance(event, Failed):
            self.failed = event.message
        if len(self.reasons) == len(self.tokens) or self.failed:
            self.done.set()


def running(engine: Engine):
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    return thread


def submit(engine: Engine, prompt: list[int], sampling: Sampling) -> tuple[Job, Collected]:
    collected = Collected(sampling)
    job = Job(prompt, sampling, collected)
    engine.submit(job)
    return job, collected


def model_calls(network) -> list[tuple[int, int]]:
    """(batch, tokens) of every call the model gets (a forward hook, and its static steps)."""
    calls = []
    network.register_forward_hook(lambda module, args, output: calls.append(tuple(args[0].shape)))
    static_step = network.static_step

    def recorded(tokens, state):
        calls.append(tuple(tokens.shape))
        return static_step(tokens, state)

    network.static_step = recorded
    return calls


DECODINGS = [(name, "stream") for name in LM_MODELS] + [(name, "static") for name in LM_MODELS if model(name).static_decoding]


def test_static_batches_step_graph_batches_and_make_their_buffers_anew_only_when_they_change_size():
    """Nine prompts at once, six of them short: static decoding steps a batch of 16 (seven spare rows), then, the six
    ended and their holes dropped, of 4 (one spare): two sets of buffers in all (on CUDA, two graph captures); every
    answer is that of generate alone."""
    network = model("tnn").double().eval()
    config = EngineConfig(context=CONTEXT, max_batch=16, max_state_memory=10**10, chunk=64, prefix_min=0, decoding="static")
    engine = Engine(network, TOKEN_BYTES, config)
    buffers, batches = [], []  # each static step's first buffer (kept: ids are reused), and its batch
    static_step = network.static_step

    def recorded(tokens, state):
        first = state.tensors()[0]
        if not any(first is seen for seen in buffers):
            buffers.append(first)
        batches.append(tokens.shape[0])
        return static_step(tokens, state)

    network.static_step = recorded
    jobs = [submit(engine, [1 + k, 2, 3], Sampling(max_tokens=4 if k < 6 else 12, temperature=0.8, seed=k)) for k in range(9)]
    with torch.no_grad():
        while engine.scheduler.unfinished:
            engine.step()
    assert len(buffers) == 2 and sorted(set(batches)) == [4, 16]
    for job, collected in jobs:
        options = {"temperature": 0.8, "seed": job.sampling.seed, "max_length": CONTEXT}
        assert collected.tokens[0] == tokenmix.generate(network, [torch.tensor(job.prompt)], job.sampling.max_tokens, **options)[0].tolist()
    assert engine.scheduler.rows == 0 and engine.scheduler.reserved == 0


def test_prompts_are_read_with_the_prefill_threads_and_steps_keep_their_own():
    """``prefill_threads``: torch's thread count during a prefill's forward, restored for the steps."""
    network = model("tnn").double().eval()
    threads = []  # (tokens in the call, torch's threads during it)
    with threads_within(1):
        engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=4, max_state_memory=10**10, prefill_threads=2))
        network.register_forward_hook(lambda module, args, output: threads.append((args[0].shape[1], torch.get_num_threads())))
        jobs = [submit(engine, list(range(1, 12)), Sampling(max_tokens=5, seed=0)) for _ in range(2)]
        with torch.no_grad():
            while engine.scheduler.unfinished:
                engine.step()
        assert torch.get_num_threads() == 1
    assert all(collected.done.is_set() for _, collected in jobs)
    assert {count for tokens, count in threads if tokens > 1} == {2} and {count for tokens, count in threads if tokens == 1} == {1}


@pytest.mark.parametrize(("name", "decoding"), DECODINGS)
def test_every_served_sequence_equals_generate_alone_while_others_run(name, decoding):
    """Prompts of different lengths arrive while others decode; each equals ``tokenmix.generate`` of its
    prompt alone (with the server's context as max_length), greedy or sampled with its own seed; batches step
    their streams, or from static buffers (run eagerly here: a CUDA graph on CUDA, ``tests/test_cuda.py``).
    Fails if rows are mispadded (a period too small), share a generator, or are stepped out of turn."""
    network = model(name).double().eval()
    config = EngineConfig(context=CONTEXT, max_batch=64, max_state_memory=10**10, chunk=8, prefix_min=0, decoding=decoding)
    engine = Engine(network, TOKEN_BYTES, config)
    calls = model_calls(network)
    generator = torch.Generator().manual_seed(3)
    jobs = []
    for index in range(12):
        prompt = torch.randint(0, 20, (int(torch.randint(1, 40, (1,), generator=generator)),), generator=generator).tolist()
        sampling = Sampling(
            max_tokens=int(torch.randint(1, 30, (1,), generator=generator)),
            temperature=(0.0, 1.0, 0.7)[index % 3],
            top_k=(None, 12)[index % 2],
            top_p=(1.0, 0.9)[index % 4 // 2],
            seed=index,
            n=1 + index % 2,
        )
        jobs.append(submit(engine, prompt, sampling))
        if index >= 5:  # the first six arrive together (their prompts are read as one batch), the others two iterations apart
            with torch.no_grad():
                engine.step()
                engine.step()
    with torch.no_grad():
        while engine.scheduler.unfinished:
            engine.step()
    for job, collected in jobs:
        assert collected.done.is_set() and collected.failed is None
        s = job.sampling
        options = {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "seed": s.seed, "max_length": CONTEXT}
        alone = tokenmix.generate(network, [torch.tensor(job.prompt)] * s.n, s.max_tokens, **options)
        assert [collected.tokens[choice] for choice in range(s.n)] == [tokens.tolist() for tokens in alone]
    assert max(batch for batch, tokens in calls if tokens == 1) >= 4  # rows of different prompts did decode together
    assert max(batch for batch, tokens in calls if tokens > 1) >= 2  # and prompts of different lengths were read together
    assert engine.scheduler.rows == 0 and engine.scheduler.reserved == 0
    timed = {sample.labels["phase"] for sample in engine.metrics.engine_seconds.collect()[0].samples}
    assert timed == set(ENGINE_PHASES)  # every lap under a phase the bench reads


@pytest.mark.parametrize("name", LM_MODELS)
def test_prompts_far_longer_than_a_young_batch_read_their_tails_in_it_and_equal_generate_alone(name):
    """A 3-token prompt starts a batch; prompts of 50-80 tokens come next, too long to be read in time to
    land on it: each reads its first tokens, joins, and reads the rest in the batch one token per step.
    One batch throughout, and each request's tokens those of ``tokenmix.generate`` alone. Fails if a
    reading row samples (its generator would run ahead), or takes a token out of turn."""
    network = model(name).double().eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=64, prefix_min=0))
    generator = torch.Generator().manual_seed(5)
    jobs = [submit(engine, [1, 2, 3], Sampling(max_tokens=40, temperature=0.0))]
    with torch.no_grad():
        engine.step()  # the short prompt starts the batch
        for k in range(3):
            prompt = torch.randint(0, 20, (50 + 15 * k,), generator=generator).tolist()
            jobs.append(submit(engine, prompt, Sampling(max_tokens=20, temperature=0.8, top_k=(None, 9)[k % 2], seed=k, n=1 + k % 2)))
        reading, batches = 0, 0
        while engine.scheduler.unfinished:
            engine.step()
            reading = max(reading, sum(bool(row.unread) for cohort in engine.scheduler.cohorts for row in cohort.rows if row is not None))
            batches = max(batches, len(engine.scheduler.cohorts))
    assert reading >= 3 and batches == 1
    for job, collected in jobs:
        s = job.sampling
        options = {"temperature": s.temperature, "top_k": s.top_k, "seed": s.seed, "max_length": CONTEXT}
        alone = tokenmix.generate(network, [torch.tensor(job.prompt)] * s.n, s.max_tokens, **options)
        assert [collected.tokens[choice] for choice in range(s.n)] == [tokens.tolist() for tokens in alone]
    assert engine.scheduler.rows == 0 and engine.scheduler.reserved == 0


@given(
    batch=st.integers(0, 300),
    tokens=st.integers(1, 300),
    chunk=st.integers(1, 64),
    period=st.sampled_from([None, 1, 3, 8, 128]),
    now=st.integers(0, 100),
)
def test_a_join_plan_lands_on_the_batch_with_whole_periods_of_padding(batch, tokens, chunk, period, now):
    plan = join_plan(batch, 0, tokens, chunk, period, 10, 10**6, now)
    if plan is None:
        return
    read = tokens - plan.tail  # the tail is read in the batch, one token per step
    fewest = -(-read // chunk)
    later_usable = plan.iterations + JOIN_EVERY <= fewest + MAX_WAIT and plan.pads + JOIN_EVERY <= max(PAD_FLOOR, tokens + 10)
    if period == 1 and later_usable and not plan.tail:  # a joining iteration lies within its wait and padding budget
        assert (now + plan.iterations) % JOIN_EVERY == 0
    assert plan.position == batch + plan.iterations == plan.pads + read
    assert plan.pads >= 0 and plan.pads % (period or 10**9) == 0 and 0 <= plan.tail <= MAX_TAIL and read >= 1
    if (
        plan.tail and (period or 1) <= MAX_WAIT
    ):  # only where the whole prompt could not land within the wait: the batch is too far behind it
        assert tokens - batch > -(-tokens // chunk) + MAX_WAIT
    sizes = chunk_sizes(read, chunk, plan.iterations)
    assert len(sizes) == plan.iterations and sum(sizes) == read and max(sizes) <= chunk
    padded = chunk_sizes(plan.position, chunk, plan.iterations)  # the rows as read: padding first
    assert len(padded) == plan.iterations and sum(padded) == plan.position and padded[-1] > 0
    assert plan.iterations - fewest <= MAX_WAIT


def test_a_join_plan_waits_for_a_batch_behind_and_refuses_one_ahead():
    assert join_plan(10, 0, 4, 8, 1, 5, 100, now=7).pads == 7  # lands at 11 after one chunk, on iteration 8
    assert join_plan(10, 0, 4, 8, 1, 5, 100, now=0).iterations == JOIN_EVERY  # waits for the next joining iteration
    assert join_plan(10, 0, 4, 8, None, 5, 100) is None  # unpadded it would have to land at 4: the batch is past it
    assert join_plan(0, 0, 30, 8, None, 5, 100).iterations == 30  # a batch behind: reading slowly to meet it
    assert join_plan(0, 0, 40 + 8 * MAX_WAIT, 8, None, 5, 1000) is None
    assert join_plan(10, 0, 4, 8, 1, 95, 100) is None  # past the context


def test_a_join_plan_reads_a_prompt_past_a_batch_far_behind_it_in_the_batch():
    """A 128-token prompt beside a batch landing at 16, with chunks of 128 tokens that padding cannot align
    (a chunked attention's): it reads 16 tokens with that batch's prefill and the other 112 in the batch."""
    assert join_plan(15, 0, 128, 512, 128, 128, 4224, landings=frozenset({16})) == JoinPlan(1, 16, 0, 112)
    assert join_plan(15, 0, 128, 512, None, 128, 4224, now=1) == JoinPlan(7, 22, 0, 106)  # no landing: a joining iteration
    assert join_plan(15, 0, 40, 512, None, 128, 4224).tail == 0  # near enough: it reads slowly to meet the batch
    assert join_plan(15, 0, 16 + MAX_TAIL + 1, 10**4, None, 128, 4224, landings=frozenset({16})).position > 16  # a tail at most MAX_TAIL
    assert join_plan(40, 0, 30, 8, 128, 5, 1000) is None  # a batch ahead, with no whole period of padding in reach
    assert join_plan(150, 0, 80, 8, 128, 20, 1000, now=2) == JoinPlan(6, 156, 128, 52)  # one period of padding, then a tail


def test_a_prompt_joins_a_batch_ahead_of_it_with_whole_chunks_of_padding_and_a_tail():
    """A chunked attention of 128-token chunks (``tcnca_simple``'s): a 60-token prompt meets a batch at about
    position 150 after 128 padded positions, reads a few tokens there and the rest in the batch; its tokens
    are those of ``tokenmix.generate`` alone."""
    network = model("tcnca_simple").double().eval()
    assert network.front_padding_period == 128
    context = 256
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=context, max_batch=4, max_state_memory=10**10, chunk=64, prefix_min=0))
    jobs = [submit(engine, [1, 2, 3, 4, 5], Sampling(max_tokens=240, temperature=0.0))]
    with torch.no_grad():
        for _ in range(146):  # the batch reaches position 150
            engine.step()
        prompt = torch.randint(0, 20, (60,), generator=torch.Generator().manual_seed(7)).tolist()
        jobs.append(submit(engine, prompt, Sampling(max_tokens=20, temperature=0.8, seed=4)))
        engine.step()
        (prefill,) = engine.scheduler.prefills
        assert prefill.pads == [128] and 0 < len(prefill.tails[0]) < 60 and len(engine.scheduler.cohorts) == 1
        while engine.scheduler.unfinished:
            engine.step()
    for job, collected in jobs:
        s = job.sampling
        alone = tokenmix.generate(
            network, [torch.tensor(job.prompt)], s.max_tokens, temperature=s.temperature, seed=s.seed, max_length=context
        )
        assert collected.tokens[0] == alone[0].tolist()


def test_a_join_plan_lands_with_an_unstarted_prefill_before_a_joining_iteration():
    assert join_plan(10, 0, 4, 8, 1, 5, 100, now=0, landings=frozenset({12})).position == 12  # read with it, not at 18
    assert join_plan(10, 0, 4, 8, 1, 5, 100, now=0, landings=frozenset({100})).iterations == JOIN_EVERY  # out of reach


def test_prompts_arriving_at_once_are_read_as_one_batch():
    """A fresh engine gets prompts of different lengths in one iteration: the shortest starts the batch, padded
    to the longest, and the others, padded alike, land with it (one prefill call for all)."""
    network = model("tnn").double().eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=64, prefix_min=0))
    calls = model_calls(network)
    requests = [(list(range(1, 4 + 5 * k)), Sampling(max_tokens=12, temperature=0.7, seed=k)) for k in range(4)]
    jobs = [submit(engine, *request) for request in requests]
    with torch.no_grad():
        while engine.scheduler.unfinished:
            engine.step()
    assert [batch for batch, tokens in calls if tokens > 1] == [4] and engine.scheduler.iterations == 1 + 12
    for (prompt, sampling), (_, collected) in zip(requests, jobs, strict=True):
        options = {"temperature": sampling.temperature, "seed": sampling.seed, "max_length": CONTEXT}
        assert collected.tokens[0] == tokenmix.generate(network, [torch.tensor(prompt)], sampling.max_tokens, **options)[0].tolist()


@pytest.mark.parametrize("quiet", [0.0, 0.5])
def test_an_idle_engine_waits_for_the_rest_of_a_burst_before_reading_it(quiet, monkeypatch):
    """Requests that come within ``BURST_QUIET`` of each other to an idle engine are read as one prefill;
    without the wait the first is read alone (and the others join it later, copying its state)."""
    monkeypatch.setattr(engine_module, "BURST_QUIET", quiet)
    monkeypatch.setattr(engine_module, "BURST_MAX", 5.0)
    network = model("tnn").eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, prefix_min=0))
    calls = model_calls(network)
    thread = running(engine)
    jobs = []
    for length in (12, 7, 9):
        jobs.append(submit(engine, list(range(1, length + 1)), Sampling(max_tokens=4, seed=length)))
        threading.Event().wait(0.05)
    assert all(collected.done.wait(60) for _, collected in jobs)
    engine.stop()
    thread.join(5)
    prefills = [batch for batch, tokens in calls if tokens > 1]
    assert prefills[0] == (3 if quiet else 1)


def test_prompts_arriving_over_several_iterations_are_read_together_and_joined_by_one_copy():
    """Three prompts come one iteration apart while a batch decodes; each lands on it at the same joining
    iteration: one prefill call of three rows, one concat, and every answer that of generate alone."""
    network = model("tnn").double().eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=64, prefix_min=0))
    calls = model_calls(network)
    state_class = type(network.init_state(1, max_length=CONTEXT))
    concat, concats = state_class.concat, []
    requests = [([1, 2, 3] * 8, Sampling(max_tokens=40, seed=0))]  # a batch past the others' lengths: they join it
    requests += [(list(range(1, 6 + 3 * k)), Sampling(max_tokens=20, temperature=0.5, seed=k)) for k in range(1, 4)]
    jobs = [submit(engine, *requests[0])]
    with torch.no_grad():
        while not (engine.scheduler.cohorts and engine.scheduler.cohorts[0].rows):  # the first decodes on its own
            engine.step()
        with patch.object(state_class, "concat", lambda states: concats.append(len(states)) or concat(states)):
            for request in requests[1:]:
                jobs.append(submit(engine, *request))
                engine.step()
            while engine.scheduler.unfinished:
                engine.step()
    prefills = [batch for batch, tokens in calls if tokens > 1]
    assert prefills[-1] == 3 and concats == [2]  # read as one batch of three rows; the cohort copied once
    for (prompt, sampling), (_, collected) in zip(requests, jobs, strict=True):
        options = {"temperature": sampling.temperature, "seed": sampling.seed, "max_length": CONTEXT}
        assert collected.tokens[0] == tokenmix.generate(network, [torch.tensor(prompt)], sampling.max_tokens, **options)[0].tolist()


@pytest.mark.parametrize(("first_tokens", "batches"), [(60, 1), (10, 2)])
def test_a_new_prompt_joins_a_batch_that_lasts_and_starts_its_own_beside_one_about_to_end(first_tokens, batches):
    """Joining pads a prompt to the batch's position: worth it while the batch's rows go on, not when
    they all end within ``MAX_WAIT`` tokens of a request that lives longer."""
    config = EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=64, prefix_min=0)
    engine = Engine(model("tnn").eval(), TOKEN_BYTES, config)
    submit(engine, [1] * 20, Sampling(max_tokens=first_tokens))
    with torch.no_grad():
        while not (engine.scheduler.cohorts and engine.scheduler.cohorts[0].rows):
            engine.step()
        submit(engine, [2] * 5, Sampling(max_tokens=60))
        engine.step()
    assert len(engine.scheduler.cohorts) == batches


def test_a_batch_started_by_a_short_prompt_leaves_room_for_longer_recent_ones():
    """After a 60-token prompt, a 5-token one that starts a batch is padded to 60, so a 60-token prompt
    arriving 3 iterations later joins that batch. Unpadded, the batch would stand at position 8, more
    than ``MAX_WAIT`` iterations behind the new prompt, and two batches would decode side by side."""
    network = model("tnn").double().eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=64, prefix_min=0))
    long_prompt = [k % 19 + 1 for k in range(60)]
    submit(engine, long_prompt, Sampling(max_tokens=2))
    requests = [([3, 1, 4, 1, 5], Sampling(max_tokens=40, temperature=0.7, seed=1)), (long_prompt[::-1], Sampling(max_tokens=12, seed=2))]
    batches = []
    with torch.no_grad():
        while engine.scheduler.unfinished:
            engine.step()
        jobs = [submit(engine, *requests[0])]
        for _ in range(3):
            engine.step()
        jobs.append(submit(engine, *requests[1]))
        while engine.scheduler.unfinished:
            engine.step()
            batches.append(len(engine.scheduler.cohorts))
    assert len(long_prompt) - len(requests[0][0]) - 3 > MAX_WAIT + 1 and max(batches) == 1
    for (prompt, sampling), (_, collected) in zip(requests, jobs, strict=True):
        options = {"temperature": sampling.temperature, "seed": sampling.seed, "max_length": CONTEXT}
        assert collected.tokens[0] == tokenmix.generate(network, [torch.tensor(prompt)], sampling.max_tokens, **options)[0].tolist()


def test_completion_text_cuts_before_a_stop_and_holds_back_what_could_start_one():
    text = CompletionText([b"a", b"b", b"c", b"\xc3", b"\xa9"], ["bc"])
    assert text.add(0) == "a"
    assert text.add(1) == ""  # "b" may begin "bc"
    assert text.add(2) == "" and text.stopped  # "bc" found: the text ends before it
    assert text.finish() == ""
    split = CompletionText([b"x", b"\xc3", b"\xa9"], [])
    assert [split.add(1), split.add(2), split.finish()] == ["", "é", ""]  # a character across two tokens waits for its end
    held = CompletionText([b"a", b"b"], ["bb"])
    assert [held.add(0), held.add(1), held.finish()] == ["a", "", "b"]  # held back, sent at the end


def test_holes_are_dropped_before_the_step_where_the_state_grows():
    """Two of eight rows end early: their holes (a quarter of the rest) are stepped until the batch reaches
    a position where a Toeplitz state doubles its history, and dropped just before that step."""
    network = model("tnn").double().eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=64, prefix_min=0))
    jobs = [submit(engine, [1, 2, 3, 4], Sampling(max_tokens=2 if k < 2 else 30, temperature=0.7, seed=k)) for k in range(8)]
    seen = []  # (position, rows) after each iteration
    with torch.no_grad():
        while engine.scheduler.unfinished:
            engine.step()
            seen += [(cohort.position, len(cohort.rows)) for cohort in engine.scheduler.cohorts if cohort.rows]  # once the prompts landed
    growth = next(position for position in range(7, CONTEXT) if engine.scheduler.sizes.grows_at(position))
    assert [rows for position, rows in seen if position < growth] and {rows for position, rows in seen if position < growth} == {8}
    assert [rows for position, rows in seen if position == growth] == [6]
    for job, collected in jobs:
        alone = tokenmix.generate(
            network, [torch.tensor(job.prompt)], job.sampling.max_tokens, temperature=0.7, seed=job.sampling.seed, max_length=CONTEXT
        )
        assert collected.tokens[0] == alone[0].tolist()


def test_a_full_engine_refuses_and_frees_its_room_when_requests_end_or_are_cancelled():
    network = model("tnn").eval()
    probe = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=4, max_state_memory=10**10, prefix_min=0))
    need = probe.scheduler.sizes.row_bytes(10, 20)
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=4, max_state_memory=2 * need, prefix_min=0))
    first, _ = submit(engine, [1] * 10, Sampling(max_tokens=20))
    submit(engine, [2] * 10, Sampling(max_tokens=20))
    with pytest.raises(Busy, match="full"):
        submit(engine, [3] * 10, Sampling(max_tokens=20))
    with pytest.raises(ValueError, match="rows"):
        submit(engine, [3] * 10, Sampling(max_tokens=20, n=5))
    with pytest.raises(ValueError, match="context"):
        submit(engine, [3] * 100, Sampling(max_tokens=100))
    first.cancel()
    thread = running(engine)
    _, third = submit_when_room(engine, [3] * 10, Sampling(max_tokens=20))
    assert third.done.wait(30) and len(third.tokens[0]) == 20
    engine.stop()
    thread.join(5)
    assert engine.scheduler.rows == 0 and engine.scheduler.reserved == 0


def submit_when_room(engine, prompt, sampling, attempts: int = 200):
    for _ in range(attempts):
        try:
            return submit(engine, prompt, sampling)
        except Busy:
            threading.Event().wait(0.05)
    raise AssertionError("the engine never made room")


def test_a_prompt_that_starts_with_a_cached_one_resumes_from_its_state():
    network = model("tnn").double().eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=16, prefix_min=32))
    calls = model_calls(network)
    thread = running(engine)
    prompt = torch.randint(0, 20, (64,)).tolist()
    results = []
    for extended in (prompt, prompt, prompt + [3, 4, 5]):
        _, collected = submit(engine, extended, Sampling(max_tokens=8, temperature=0.8, seed=1))
        assert collected.done.wait(30)
        results.append(collected.tokens[0])
    engine.stop()
    thread.join(5)
    assert engine.metrics.prefix_hits._value.get() == 2
    for extended, tokens in zip((prompt, prompt, prompt + [3, 4, 5]), results, strict=True):
        alone = tokenmix.generate(network, [torch.tensor(extended)], 8, temperature=0.8, seed=1, max_length=CONTEXT)[0]
        assert tokens == alone.tolist()
    assert calls  # the model ran


@pytest.mark.parametrize(("chunk", "resumed"), [(16, False), (4, True)])
def test_a_cached_prompt_shorter_than_a_chunk_is_read_again_to_join_the_batch(chunk, resumed):
    """A 10-token prompt, cached, comes again beside a new 12-token one. Under a chunk of 16 the new one is
    read in one iteration and stands past the cached state's position: resuming would decode in a batch
    of its own (two model calls per step, for its whole completion) to save less than one chunk of
    reading, so it is read again with the new prompt, one batch (as is any cached prompt shorter
    than a chunk whose state lands on no running batch). Under a chunk of 4 the new prompt
    takes three iterations, the cached state lands on its batch, and it resumes."""
    network = model("tnn").double().eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=chunk, prefix_min=8))
    cached = list(range(1, 11))
    submit(engine, cached, Sampling(max_tokens=2))
    with torch.no_grad():
        while engine.scheduler.unfinished:
            engine.step()
    calls = model_calls(network)
    requests = [
        (list(range(3, 15)), Sampling(max_tokens=6, temperature=0.7, seed=1)),
        (cached, Sampling(max_tokens=6, temperature=0.7, seed=2)),
    ]
    jobs = [submit(engine, *request) for request in requests]
    with torch.no_grad():
        while engine.scheduler.unfinished:
            engine.step()
    assert engine.metrics.prefix_hits._value.get() == int(resumed)
    assert max(batch for batch, tokens in calls if tokens == 1) == 2  # one batch: both rows stepped in one call
    assert {batch for batch, tokens in calls if tokens > 1} == {1 if resumed else 2}  # the new prompt's chunks, or both prompts'
    for (prompt, sampling), (_, collected) in zip(requests, jobs, strict=True):
        options = {"temperature": sampling.temperature, "seed": sampling.seed, "max_length": CONTEXT}
        assert collected.tokens[0] == tokenmix.generate(network, [torch.tensor(prompt)], sampling.max_tokens, **options)[0].tolist()


def test_a_model_failure_fails_the_running_requests_and_the_engine_goes_on():
    network = model("tnn").eval()
    engine = Engine(network, TOKEN_BYTES, EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, prefix_min=0))
    original = network.forward

    def failing(tokens, *args, **kwargs):
        if tokens.shape[1] == 1:  # the first decode step breaks, once
            network.forward = original
            raise RuntimeError("out of memory (simulated)")
        return original(tokens, *args, **kwargs)

    network.forward = failing
    thread = running(engine)
    _, failed = submit(engine, [1, 2, 3], Sampling(max_tokens=5))
    assert failed.done.wait(30) and "out of memory (simulated)" in failed.failed
    _, served = submit(engine, [1, 2, 3], Sampling(max_tokens=5))
    assert served.done.wait(30) and served.failed is None and len(served.tokens[0]) == 5
    engine.stop()
    thread.join(5)
    assert engine.scheduler.rows == 0 and engine.scheduler.reserved == 0


@pytest.mark.parametrize("moment", ["queued", "reading", "joining"])
def test_a_request_cancelled_while_its_prompt_is_read_frees_its_room(moment):
    """Cancelled while queued, while its prompt is read, or as the read prompt joins its batch (after the
    engine looked for cancelled requests in that iteration): its rows and bytes come back, and the
    request beside it completes."""
    config = EngineConfig(context=CONTEXT, max_batch=8, max_state_memory=10**10, chunk=4, prefix_min=0)
    engine = Engine(model("tnn").eval(), TOKEN_BYTES, config)
    _, kept = submit(engine, [1] * 12, Sampling(max_tokens=20))
    cancelled, _ = submit(engine, [2] * 10, Sampling(max_tokens=3, n=2))
    join = engine.runner.join

    def joining(step):
        if moment == "joining" and any(cancelled in prefill.jobs for prefill, _ in step.parts):
            cancelled.cancel()
        join(step)

    engine.runner.join = joining
    with torch.no_grad():
        if moment == "queued":
            cancelled.cancel()
        for iteration in range(100):
            engine.step()
            if moment == "reading" and iteration == 1:
                cancelled.cancel()
            if not engine.scheduler.unfinished:
                break
    assert len(kept.tokens[0]) == 20 and engine.scheduler.rows == 0 and engine.scheduler.reserved == 0
