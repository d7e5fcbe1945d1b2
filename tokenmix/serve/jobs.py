"""A request inside the engine (``Job``), its settings (``Sampling``), the events it emits and the refusals
the engine answers with."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


class Busy(Exception):
    """The server has no room for the request now (HTTP 429); ``retry_after`` seconds is a fair wait."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(Exception):
    """The server is shutting down and takes no new requests (HTTP 503)."""


@dataclass(frozen=True)
class Sampling:
    """A request's generation settings (the OpenAI completions fields, validated by ``requests.py``)."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    n: int = 1


@dataclass
class Token:
    """Event: choice ``choice`` got ``token``; ``text`` is what it makes final; ``logprobs`` when asked."""

    choice: int
    token: int
    text: str
    logprobs: dict | None = None


@dataclass
class Finished:
    """Event: choice ``choice`` ended ("stop" or "length"); ``text`` is what was still held back."""

    choice: int
    reason: str
    text: str


@dataclass
class Failed:
    """Event: the request failed inside the engine (its message is safe to show)."""

    message: str


@dataclass(eq=False)  # a job is itself, not its fields: the scheduler keeps a set of them
class Job:
    """A request inside the engine: its prompt ids, settings, and where its events go (``emit`` is
    called from the engine's thread)."""

    prompt: list[int]
    sampling: Sampling
    emit: Callable[[object], None]
    cancelled: bool = False
    reserved: int = 0
    unfinished: int = 0
    arrived: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    tokens: int = 0

    def cancel(self) -> None:
        """The client went away: its sequences leave at the next iteration."""
        self.cancelled = True
