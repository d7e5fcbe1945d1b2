"""Progress bars: redrawn live on a terminal, one update every ``LOG_INTERVAL_S`` seconds in a log file.

tqdm redraws with carriage returns whatever its output is; redirected to a file, a bar updated
every step leaves thousands of updates on one line. Away from a terminal the bar updates rarely.
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

LOG_INTERVAL_S = 30.0


def progress_bar(iterable=None, *, file=None, **options) -> tqdm:
    """``tqdm(iterable, **options)`` writing to ``file`` (default: standard error), live only on a terminal."""
    stream = file if file is not None else sys.stderr
    interactive = hasattr(stream, "isatty") and stream.isatty()
    return tqdm(iterable, file=stream, mininterval=0.1 if interactive else LOG_INTERVAL_S, **options)
