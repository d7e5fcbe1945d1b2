import math

import pytest

from tokenmix.train.schedule import SCHEDULES, lr_multiplier


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_warmup_ramps_linearly_to_the_peak(schedule):
    assert [lr_multiplier(step, 100, 4, schedule) for step in range(4)] == [0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize(
    "schedule, halfway, end",
    [("cosine", 0.55, 0.1), ("linear", 0.55, 0.1), ("inverse_sqrt", math.sqrt(10 / 56), math.sqrt(10 / 101)), ("constant", 1.0, 1.0)],
)
def test_decay_after_the_warmup(schedule, halfway, end):
    """100 steps after a warmup of 10, min_ratio 0.1: the value halfway (step 55) and at the last step."""
    assert lr_multiplier(55, 100, 10, schedule, 0.1) == pytest.approx(halfway)
    assert lr_multiplier(100, 100, 10, schedule, 0.1) == pytest.approx(end)


def test_linear_decay_is_a_straight_line():
    values = [lr_multiplier(step, 110, 10, "linear", 0.0) for step in range(10, 111, 25)]
    assert values == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="schedule must be one of"):
        lr_multiplier(0, 10, 1, "step")
