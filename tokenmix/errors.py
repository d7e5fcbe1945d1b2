"""Errors the command line reports in one line: problems with what the user asked for.

Library code raises ValueError for bad input. The CLI reads arguments, data and checkpoints inside
``user_input()``, which turns those ValueErrors into ``UsageError``; a ValueError raised later, deep
in a long run, is a bug and keeps its traceback. A ``MachineFault`` (failing storage, a dead peer)
is reported in one line wherever it happens.
"""

from __future__ import annotations

import contextlib


class MachineFault(Exception):
    """The machine failed the command (a full or read-only disk, an I/O error, a process that stopped
    answering): the CLI prints the message alone and exits with status 1. What was saved before stays whole."""


class UsageError(Exception):
    """A problem with the command's input; the CLI prints the message alone and exits with status 2."""


@contextlib.contextmanager
def user_input():
    """Treat ValueErrors raised inside as problems with the user's input."""
    try:
        yield
    except ValueError as error:
        raise UsageError(str(error)) from error
