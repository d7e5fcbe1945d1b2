"""How a run stops early: SIGINT / SIGTERM become a request to stop after the current step
(``TrainingInterrupted`` once the checkpoint is saved); a non-finite loss is ``TrainingDiverged``."""

from __future__ import annotations

import signal
import threading


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped training after a checkpoint was saved."""


class RunFinished(ValueError):
    """A resume of a run that already trained its steps and saved its model: nothing to do."""


class TrainingDiverged(Exception):
    """The loss became NaN or Inf; the last good checkpoint is kept."""


class StopSignals:
    """Turns SIGINT / SIGTERM into a request to stop after the current step (main thread only).

    A second signal restores the default behaviour, so pressing Ctrl-C twice quits at once.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: str | None = None
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        return self

    def _handle(self, number, frame):  # only a flag: writing here could cut into a write of the progress bar
        self.received = signal.Signals(number).name
        for restored, handler in self.previous.items():
            signal.signal(restored, handler)

    def __exit__(self, *exc):
        for number, handler in self.previous.items():
            signal.signal(number, handler)
