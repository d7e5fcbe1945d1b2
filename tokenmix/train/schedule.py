"""Learning-rate schedules as multipliers of the peak rate."""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "linear", "inverse_sqrt", "constant")


def lr_multiplier(step: int, total_steps: int, warmup: int, schedule: str, min_ratio: float = 0.1) -> float:
    """Linear warmup over ``warmup`` steps, then cosine or linear decay to ``min_ratio`` at
    ``total_steps``, 1/sqrt decay, or constant."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / (step + 1))
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def steps_in_budget(minutes: float, step: int, train_seconds: float, seconds_per_step: float | None = None) -> int | None:
    """The step count a time budget of ``minutes`` allows: ``step`` steps so far (``train_seconds`` of training) plus
    what the rest of it buys at ``seconds_per_step``. 90 % of the budget goes to training steps (the rest to
    validation); the pace is the run's own so far unless given (None when no step has been timed yet)."""
    if seconds_per_step is None:
        if step == 0 or train_seconds <= 0:
            return None
        seconds_per_step = train_seconds / step
    budget = minutes * 60.0 * 0.9
    return max(step, step + int((budget - train_seconds) / seconds_per_step))
