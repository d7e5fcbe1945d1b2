"""One session of a run, from its start (or a resume) to its end (or a stop): its progress bar, the pace
of its steps, and when its next checkpoint is due. Times are readings of the training loop's clock
(``time.perf_counter``), passed in."""

from __future__ import annotations

from ..io.progress import progress_bar
from .config import parse_interval


class Session:
    """A session that starts at ``step`` of ``total_steps`` (None: not fixed yet) at time ``now``; its bar is
    ``shown`` or not, and first writes ``notes``; a checkpoint is due every ``save_every`` (``TrainConfig.save_every``)."""

    def __init__(self, step: int, total_steps: int | None, shown: bool, save_every: str, now: float, notes: list[str]):
        self.bar = progress_bar(total=total_steps, initial=step, disable=not shown, unit="step", dynamic_ncols=True)
        for note in notes:
            self.bar.write(note)
        self.step_seconds: list[float] = []
        self.trained_tokens = 0  # on every rank
        self.started = self.last_save = now
        self.save_steps, self.save_seconds = parse_interval(save_every)

    @property
    def seconds_per_step(self) -> float:
        return sum(self.step_seconds) / len(self.step_seconds)

    def show(self, loss: float, tokens: int, elapsed: float) -> float:
        """A step done: its ``tokens`` (every process's) counted, its loss and rate shown; returns the rate."""
        self.trained_tokens += tokens
        rate = tokens / elapsed
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}")
        return rate

    def save_due(self, step: int, now: float) -> bool:
        """Whether ``save_every`` calls for a checkpoint after ``step``, at time ``now``."""
        return step % self.save_steps == 0 if self.save_steps else now - self.last_save >= self.save_seconds

    def pace(self) -> dict:
        """The session's mean step time and tokens per second (nothing when it trained no step)."""
        if not self.step_seconds:
            return {}
        return {"seconds_per_step": self.seconds_per_step, "train_tokens_per_s": self.trained_tokens / sum(self.step_seconds)}
