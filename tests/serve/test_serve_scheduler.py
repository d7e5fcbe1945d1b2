"""The scheduler alone, with a fake model runner and no model: admission under the memory budget, the
plans (``StepPlan``) it makes, cohorts, holes and compaction; and the ``ServeConfig`` that crosses the
process boundary."""

from __future__ import annotations

import json
import pickle

import pytest

pytest.importorskip("prometheus_client", reason='the server needs its extra: pip install "tokenmix[serve]"')

from tokenmix.serve.config import EngineConfig, ServeConfig  # noqa: E402
from tokenmix.serve.jobs import Busy, Finished, Job, Sampling, Token, Unavailable  # noqa: E402
from tokenmix.serve.memory import StateSizes  # noqa: E402
from tokenmix.serve.metrics import ServeMetrics  # noqa: E402
from tokenmix.serve.output import OutputProcessor  # noqa: E402
from tokenmix.serve.scheduler import Scheduler  # noqa: E402
from tokenmix.serve.step import ChunkStep, ModelOutput, SampledToken  # noqa: E402

ROW_BYTES = 1000
TOKEN = 7  # what every sampling row draws
TOKEN_BYTES = [bytes([65 + byte]) for byte in range(20)]  # TOKEN is "H"


class FakeState:
    """A stand-in for a streaming state: only its row count."""

    def __init__(self, rows: int):
        self.rows = rows

    def nbytes(self) -> int:
        return self.rows

    def select(self, rows: list[int]) -> FakeState:
        return FakeState(len(rows))


class FakeSizes(StateSizes):
    """Every row weighs ``ROW_BYTES`` at every position (with ``static`` decoding, its static buffers too); the states
    grow at ``grows``. Nothing measured: the compaction and spare-row rules are ``StateSizes``'s own."""

    def __init__(self, grows: tuple[int, ...] = (), static: bool = False):
        self.grows, self.static, self.static_row = grows, static, ROW_BYTES if static else 0

    def at(self, position: int) -> int:
        return ROW_BYTES

    def grows_at(self, position: int) -> bool:
        return position in self.grows

    def row_bytes(self, prompt: int, max_tokens: int) -> int:
        return ROW_BYTES


class FakeRunner:
    """Executes plans without a model: a prefill's chunk advances it, every sampling row draws ``TOKEN``."""

    def execute(self, plan) -> ModelOutput:
        for chunk in plan.chunks:
            prefill = chunk.prefill
            if prefill.state is None:
                prefill.fed, prefill.state = prefill.unread(), FakeState(len(prefill.jobs))
            prefill.fed += chunk.size
        return ModelOutput([SampledToken(decode.cohort, row, TOKEN) for decode in plan.decodes for row in decode.rows])


class Served:
    """A scheduler, the fake runner and a real output processor, stepped by hand; ``events`` by job."""

    def __init__(self, grows: tuple[int, ...] = (), period: int | None = 1, static: bool = False, **options):
        config = EngineConfig(**{"context": 200, "max_batch": 8, "max_state_memory": 10**6, "prefix_min": 0, **options})
        self.metrics = ServeMetrics()
        self.scheduler = Scheduler(config, FakeSizes(grows, static), period, TOKEN_BYTES, self.metrics)
        self.runner, self.outputs = FakeRunner(), OutputProcessor(self.metrics)
        self.events: dict[int, list] = {}

    def submit(self, prompt: list[int], **sampling) -> Job:
        job = Job(prompt, Sampling(**{"max_tokens": 4, **sampling}), lambda event: self.events[id(job)].append(event))
        self.events[id(job)] = []
        self.scheduler.submit(job)
        return job

    def step(self):
        plan = self.scheduler.schedule()
        ended = self.outputs.process(self.runner.execute(plan).sampled)
        self.scheduler.update_from_output(plan, ended)
        return plan


def test_admission_reserves_rows_and_bytes_and_refuses_past_the_budget():
    served = Served(max_state_memory=2 * ROW_BYTES + 1, max_batch=3)
    served.submit([1, 2, 3])
    served.submit([4, 5])
    assert served.scheduler.reserved == 2 * ROW_BYTES and served.scheduler.rows == 2
    with pytest.raises(Busy, match="full"):
        served.submit([6])
    with pytest.raises(ValueError, match="rows"):
        served.submit([6], n=4)  # more than --max-batch: never
    with pytest.raises(ValueError, match="context"):
        served.submit([6] * 190, max_tokens=20)
    served.scheduler.drain()
    with pytest.raises(Unavailable):
        served.submit([6])
    assert served.metrics.requests.labels("refused")._value.get() == 1


def test_prompts_arriving_together_are_read_as_one_prefill_and_join_one_cohort():
    """The first plan reads the three prompts as one chunk (right-aligned: padded to the longest); the
    next joins them to their cohort in one step and samples every row."""
    served = Served()
    jobs = [served.submit(list(range(1, length + 1))) for length in (8, 3, 5)]
    first = served.step()
    assert first.iteration == 0 and not first.joins and not first.decodes
    (chunk,) = first.chunks
    assert chunk.size == 8 and [len(job.prompt) for job in chunk.prefill.jobs] == [3, 5, 8]  # the shortest first
    assert chunk.prefill.pads == [5, 3, 0]
    second = served.step()
    (join,) = second.joins
    assert join.parts == [(chunk.prefill, None)] and join.slots == [] and join.reset  # a new cohort: no live row yet
    (decode,) = second.decodes
    assert decode.cohort is join.cohort and decode.cohort.position == 9 and decode.sampling == [0, 1, 2] and decode.keep is None
    assert decode.steps == [3, 3, 3] and not second.chunks  # each row: 4 tokens, one sampled now
    assert all(events == [Token(0, TOKEN, "H")] for events in served.events.values()) and len(jobs) == 3


def test_a_long_prompt_is_read_in_chunks_and_joins_after_its_last():
    served = Served(chunk=4)
    served.submit(list(range(10)))
    plans = [served.step() for _ in range(4)]
    assert [[chunk.size for chunk in plan.chunks] for plan in plans] == [[4], [3], [3], []]  # even chunks of at most 4
    assert [len(plan.joins) for plan in plans] == [0, 0, 0, 1] and plans[3].decodes[0].cohort.position == 11


def test_rows_reaching_max_tokens_leave_holes_dropped_at_three_quarters_of_the_batch():
    """Four rows, three ending after one token: they leave before the step, and three holes of four rows
    are dropped by the step (``keep``); their rows and bytes come back once their events are out."""
    served = Served()
    for max_tokens in (1, 1, 1, 5):
        served.submit([1, 2, 3], max_tokens=max_tokens)
    served.step()
    plan = served.step()
    (decode,) = plan.decodes
    assert decode.sampling == [0, 1, 2, 3] and decode.keep == [3] and decode.steps == [4]
    assert len(decode.cohort.rows) == 1 and decode.cohort.holes == {}
    ended = [events[-1] for events in served.events.values()]
    assert ended[:3] == [Finished(0, "length", "")] * 3 and isinstance(ended[3], Token)
    assert served.scheduler.rows == 1 and served.scheduler.reserved == ROW_BYTES


def test_holes_stay_until_a_step_where_the_state_grows():
    """One hole of four rows is stepped (cheaper than copying the state) until the state grows: a quarter of
    the live rows, then dropped before that step."""
    served = Served(grows=(8,))
    for max_tokens in (1, 9, 9, 9):
        served.submit([1, 2, 3], max_tokens=max_tokens)
    served.step()
    kept = []
    while served.scheduler.cohorts and served.scheduler.cohorts[0].position < 8:
        (decode,) = served.step().decodes
        kept.append((decode.cohort.position, decode.keep))
    assert kept == [(4, None), (5, None), (6, None), (7, None), (8, [1, 2, 3])]
    assert served.scheduler.cohorts[0].holes == {}


def test_static_batches_grow_by_graph_batches_whose_spare_rows_later_rows_take_in_place():
    """Static decoding: a cohort's buffers are made for 1, 2, 4, then 8 rows (``graph_batch``) as rows join one at a
    time; its spare rows are holes that reserve a row's bytes, and later rows take them in place (nothing appended,
    so the graph captured on the buffers stays). The state growing drops no hole (static buffers do not grow)."""
    served = Served(grows=(40,), static=True, max_batch=12, max_state_memory=10**7)  # at 40: three spare rows of eight
    joins, keeps = [], []  # (rows joined in place, spare rows made, the cohort's rows after the join); compactions
    for _ in range(6):
        served.submit([1, 2, 3], max_tokens=100)
        plans = [served.step()]
        while not plans[-1].joins and len(plans) < 20:  # joins land every eighth iteration
            plans.append(served.step())
        keeps += [decode.keep for plan in plans for decode in plan.decodes if decode.keep is not None]
        (join,) = plans[-1].joins
        joins.append((len(join.slots), join.padding, len(join.cohort.rows)))
    assert joins == [(0, 0, 1), (0, 0, 2), (0, 1, 4), (1, 0, 4), (0, 3, 8), (1, 0, 8)] and keeps == []
    (cohort,) = served.scheduler.cohorts
    assert cohort.position > 40 and cohort.holes == {6: ROW_BYTES, 7: ROW_BYTES}
    assert served.scheduler.reserved == 8 * ROW_BYTES  # six requests' and two spare rows'


@pytest.mark.parametrize(("max_batch", "budget_rows", "padding"), [(16, 100, 7), (12, 100, 3), (16, 11, 2)])
def test_spare_rows_stay_within_the_batch_and_memory_limits(max_batch, budget_rows, padding):
    """Nine rows joining at once would get seven spare rows: no more than ``max_batch`` rows in all, nor more bytes than
    the budget has room for beside the requests' reservations."""
    served = Served(static=True, max_batch=max_batch, max_state_memory=budget_rows * ROW_BYTES)
    for _ in range(9):
        served.submit([1, 2, 3], max_tokens=20)
    (join,) = next(plan.joins for plan in (served.step() for _ in range(10)) if plan.joins)
    assert join.padding == padding and served.scheduler.reserved == (9 + padding) * ROW_BYTES


def test_static_batches_drop_their_holes_down_to_a_graph_batch_of_live_rows():
    """Nine rows joining at once get a batch of 16 (seven spare); six ending leave thirteen holes of sixteen: dropped,
    the three live rows kept with one spare row (a graph batch of 4); every byte comes back at the end."""
    served = Served(static=True, max_batch=16, max_state_memory=10**7)
    for k in range(9):
        served.submit([1, 2, 3], max_tokens=5 if k < 6 else 20)
    seen = []
    while served.scheduler.cohorts or served.scheduler.prefills or served.scheduler.waiting:
        plan = served.step()
        seen += [("join", len(join.cohort.rows), join.padding) for join in plan.joins]
        seen += [("keep", len(decode.keep), decode.padding) for decode in plan.decodes if decode.keep is not None]
    assert seen == [("join", 16, 7), ("keep", 3, 1), ("keep", 0, 0)]
    assert served.scheduler.rows == 0 and served.scheduler.reserved == 0


def test_a_row_stopped_by_a_stop_string_is_stepped_once_more_then_leaves_a_hole():
    """A stop string is found in the token's text, after the step that sampled it (as vLLM finds it in its
    front process): that step still steps the row, the next has a hole there."""
    served = Served()
    served.submit([1, 2, 3], max_tokens=5, stop=("H",))
    kept = served.submit([1, 2, 3], max_tokens=5)
    served.step()
    stepped = served.step().decodes[0]
    assert stepped.sampling == [0, 1] and stepped.steps == [4, 4]
    assert served.scheduler.cohorts[0].holes == {0: ROW_BYTES} and served.scheduler.rows == 1
    after = served.step().decodes[0]
    assert after.sampling == [1] and after.steps == [0, 3] and after.rows[0].job is kept


def test_every_request_ends_and_gives_back_its_room_cancelled_ones_too():
    served = Served(chunk=2)
    jobs = [served.submit(list(range(1, 2 + k)), max_tokens=3 + k, n=1 + k % 2) for k in range(5)]
    served.step()
    jobs[1].cancel()
    for _ in range(100):
        if served.scheduler.idle():
            break
        served.step()
    assert served.scheduler.idle() and served.scheduler.rows == 0 and served.scheduler.reserved == 0
    assert served.metrics.requests.labels("cancelled")._value.get() == 1
    assert served.metrics.requests.labels("completed")._value.get() == 4
    for job in jobs[:1] + jobs[2:]:
        tokens = [event for event in served.events[id(job)] if isinstance(event, Token)]
        assert len(tokens) == job.sampling.max_tokens * job.sampling.n


def test_a_failure_answers_every_request_and_frees_the_scheduler():
    served = Served()
    jobs = [served.submit([1, 2, 3]) for _ in range(3)]
    served.step()
    served.scheduler.fail_all("the model failed: simulated")
    assert all(served.events[id(job)][-1].message == "the model failed: simulated" for job in jobs)
    assert served.scheduler.rows == 0 and served.scheduler.reserved == 0 and not served.scheduler.has_work()


def test_plans_are_plain_data_in_the_order_they_run():
    served = Served()
    served.submit([1, 2])
    plan = served.step()
    assert [type(chunk) for chunk in plan.chunks] == [ChunkStep] and plan.joins == [] and plan.decodes == []


def test_the_serve_config_is_checked_once_and_crosses_processes_as_plain_data():
    engine = EngineConfig(context=320, max_batch=4, max_state_memory=10**9, prefill_threads=2)
    config = ServeConfig(served="runs/lm", device="cpu", precision="bf16", threads=1, engine=engine, kernels="torch")
    assert ServeConfig.from_dict(json.loads(json.dumps(config.as_dict()))) == config
    assert pickle.loads(pickle.dumps(config)) == config
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1"):
        EngineConfig(context=320, max_batch=0, max_state_memory=10**9)
    with pytest.raises(ValueError, match="prefix_min must be an integer >= 0"):
        EngineConfig(context=320, max_batch=4, max_state_memory=10**9, prefix_min=-1)
    with pytest.raises(ValueError, match="precision must be one of"):
        ServeConfig(served="runs/lm", device="cpu", precision="fp8", threads=1, engine=engine)
    with pytest.raises(ValueError, match=r"kernels must be one of \['auto', 'torch', 'fused'\], got 'triton'"):
        ServeConfig(served="runs/lm", device="cpu", precision="fp32", threads=1, engine=engine, kernels="triton")
    with pytest.raises(ValueError, match="engine must be an EngineConfig"):
        ServeConfig(served="runs/lm", device="cpu", precision="fp32", threads=1, engine={"context": 320})
