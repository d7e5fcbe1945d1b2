"""The engine in a process of its own, so that the HTTP event loop and the model's thread share no GIL.

In one process, every token the event loop writes (a JSON chunk through the ASGI stack) holds the
GIL the engine's thread needs between two tensor operations: the loop's work and the model's
dispatch run one after the other even on two cores. Here ``EngineProcess`` (in the server) starts
``Engine`` in a child process and talks to it over two pipes: the server sends requests,
cancellations and questions (admission, metrics, idleness); the child answers each question, and
after every iteration sends the events of all its rows in one message.

The server outlives its engine: when the child dies, its running requests end with an error and a
new child is started (``EngineChild`` is one child, ``EngineProcess`` the sequence of them); a crash
loop (more than ``restarts`` deaths within a minute) fails the engine, and the server exits.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from ..fields import Integer
from .config import ServeConfig
from .jobs import Busy, Failed, Finished, Job, Sampling, Unavailable

STARTUP_SECONDS = 600  # loading the model and measuring its state sizes
RESTART_WINDOW = 60  # seconds: the engine has failed when its process dies more than ``restarts`` times within it


@dataclass(eq=False)
class RemoteJob:
    """A request as the server holds it: its prompt, settings, where its events go, and its choices still
    running (at 0 it is forgotten: nothing is left to cancel)."""

    prompt: list[int]
    sampling: Sampling
    emit: object
    number: int = 0
    running: int = field(init=False)

    def __post_init__(self):
        self.running = self.sampling.n


@dataclass
class EngineStopped(Failed):
    """Event: the engine's process died under the request (HTTP 503: once it is restarted, a retry is served)."""


class Restarting(Unavailable):
    """Refusal: the engine's process died and a new one is starting (HTTP 503, ``Retry-After`` seconds)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class EngineExited(RuntimeError):
    """The engine's process exited while it started."""


def exit_text(code: int | None) -> str:
    """A process's exit code as people read it: ``-9 (SIGKILL)`` for a signal."""
    try:
        return f"{code} ({signal.Signals(-code).name})"
    except (TypeError, ValueError):  # None, an exit status, or a signal without a name
        return str(code)


class EngineChild:
    """One engine process and the server's side of its pipes: ``wait_ready``, ``submit`` (awaitable; raises
    ``Busy``, ``Unavailable`` or ValueError as ``Engine.submit`` does), ``cancel``, ``ask``, ``read`` (until
    the process goes), ``close`` (fail what still runs), ``stop``."""

    def __init__(self, config: ServeConfig):
        context = multiprocessing.get_context("spawn")
        self.requests, child_requests = context.Pipe(duplex=False)[::-1]  # (send end here, receive end there)
        child_events, self.events = context.Pipe(duplex=False)[::-1]
        # a daemon: ended at this process's exit whatever happens (a clean stop first asks it to end)
        self.process = context.Process(
            target=serve_engine, args=(child_requests, child_events, config), name="tokenmix-engine", daemon=True
        )
        self.process.start()
        self.pid = self.process.pid
        child_requests.close()
        child_events.close()
        self.alive, self.vocab_size = True, None
        self.jobs: dict[int, RemoteJob] = {}
        self.answers: dict[int, Future] = {}
        self.numbers = itertools.count(1)
        self.send_lock, self.state_lock = threading.Lock(), threading.Lock()

    def wait_ready(self) -> None:
        """Wait until the engine is loaded (its ``vocab_size`` set); ValueError when the child refused its
        configuration, RuntimeError when it exited or took too long."""
        if not self.events.poll(STARTUP_SECONDS):
            self.process.kill()
            raise RuntimeError(f"the engine process did not start within {STARTUP_SECONDS} s")
        try:
            kind, value = self.events.recv()
        except EOFError:
            self.process.join(1)
            raise EngineExited(f"the engine process exited while starting (exit code {exit_text(self.process.exitcode)})") from None
        if kind == "error":
            self.process.join(30)
            raise ValueError(value)
        self.vocab_size = value

    def send(self, message: tuple) -> bool:
        """Whether it went: not once the engine's process is gone (its reader then fails what was running)."""
        try:
            with self.send_lock:
                self.requests.send(message)
        except (BrokenPipeError, OSError):
            return False
        return True

    def ask(self, question: str, *arguments) -> Future:
        """The child's answer; ``Unavailable`` while it loads (it reads no messages yet) or once it is gone."""
        answer: Future = Future()
        with self.state_lock:
            if not self.alive or self.vocab_size is None:
                answer.set_exception(Unavailable("the engine is starting" if self.alive else "the engine has stopped"))
                return answer
            number = next(self.numbers)
            self.answers[number] = answer
        if not self.send((question, number, *arguments)):
            with self.state_lock:
                self.answers.pop(number, None)
            answer.set_exception(Unavailable("the engine has stopped"))
        return answer

    async def submit(self, job: RemoteJob) -> None:
        with self.state_lock:
            job.number = next(self.numbers)
            self.jobs[job.number] = job
        try:
            refusal = await asyncio.wrap_future(self.ask("submit", job.number, job.prompt, job.sampling))
        except BaseException:  # the engine stopped, or the handler was cancelled: nothing runs for it here
            self.cancel(job)
            raise
        if refusal is not None:
            with self.state_lock:
                self.jobs.pop(job.number, None)
            kind, message, retry_after = refusal
            raise {"busy": Busy(message, retry_after), "unavailable": Unavailable(message)}.get(kind, ValueError(message))

    def cancel(self, job: RemoteJob) -> None:
        """The client went away (or the answer is complete): its rows leave at the engine's next iteration.
        A job of an earlier process (numbers start again in each) is not this one's."""
        with self.state_lock:
            running = self.jobs.get(job.number) is job and job.running > 0
            if running:
                del self.jobs[job.number]
        if running:
            self.send(("cancel", job.number))

    def stop(self) -> None:
        if self.vocab_size is not None and self.send(("stop",)):  # one still loading reads no messages
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()

    def read(self) -> None:
        """Deliver the child's events and answers until it goes."""
        while True:
            try:
                kind, payload = self.events.recv()
            except (EOFError, OSError):
                break
            if kind == "events":
                for number, event in payload:
                    self._deliver(number, event)
            else:
                number, value = payload
                with self.state_lock:
                    answer = self.answers.pop(number, None)
                if answer is not None and not answer.done():  # a cancelled asker's answer is dropped
                    answer.set_result(value)
        self.process.join(1)

    def _deliver(self, number: int, event) -> None:
        with self.state_lock:
            job = self.jobs.get(number)
            if job is None:
                return
            if isinstance(event, (Finished, Failed)):
                job.running = 0 if isinstance(event, Failed) else job.running - 1
                if job.running == 0:
                    del self.jobs[number]
        try:
            job.emit(event)
        except RuntimeError:  # its event loop is closed: the server is stopping
            pass

    def close(self, message: str) -> None:
        """The process is gone: every request still running ends with ``EngineStopped(message)``, every
        question with ``Unavailable(message)``, and the pipes are closed."""
        with self.state_lock:
            self.alive = False
            jobs, self.jobs = list(self.jobs.values()), {}
            answers, self.answers = list(self.answers.values()), {}
        for answer in answers:
            if not answer.done():
                answer.set_exception(Unavailable(message))
        for job in jobs:
            try:
                job.emit(EngineStopped(message))
            except RuntimeError:  # its event loop is closed: the server is stopping
                pass
        with self.send_lock:
            self.requests.close()
        self.events.close()


class EngineProcess:
    """The server's engine: one ``EngineChild`` at a time, a new one started when its process dies, unless
    the process died more than ``restarts`` times within ``RESTART_WINDOW`` seconds: then the engine has
    failed, ``on_failure``'s callback is told why, and the server should exit (as vLLM's does when its
    engine dies). ``submit``, ``cancel``, ``drain``, ``idle``, ``metrics_text``, ``health``, ``stop``;
    ``report(line)`` hears of each restart."""

    def __init__(self, config: ServeConfig, *, restarts: int, report: Callable[[str], None] | None = None):
        self.allowed = Integer(0).check(restarts, "restarts")
        self.config, self.report = config, report or (lambda line: None)
        self.lock = threading.Lock()
        self.state = "ok"  # then "restarting", back to "ok"; or "draining", "stopped", "failed"
        self.restarts, self.last_exit_code, self.cause = 0, None, ""
        self.deaths: deque[tuple[float, int | None]] = deque()  # (time, exit code) within the window
        self.failure: str | None = None
        self.failure_callback: Callable[[str], None] | None = None
        self.child = EngineChild(config)
        began = time.monotonic()
        self.child.wait_ready()
        self.startup_seconds = time.monotonic() - began
        self.vocab_size = self.child.vocab_size
        threading.Thread(target=self._supervise, name="tokenmix-engine-supervisor", daemon=True).start()

    async def submit(self, job: RemoteJob) -> None:
        with self.lock:
            if self.state != "ok":
                raise self._refusal()
            child = self.child
        await child.submit(job)

    def _refusal(self) -> Unavailable:
        if self.state == "restarting":
            retry_after = max(1, math.ceil(self.startup_seconds))
            return Restarting(f"the engine is restarting after its process died ({self.cause}); retry in {retry_after} s", retry_after)
        if self.state == "draining":
            return Unavailable("the server is shutting down and takes no new requests")
        return Unavailable(self.failure or "the engine has stopped")

    def cancel(self, job: RemoteJob) -> None:
        self.child.cancel(job)

    async def metrics_text(self) -> bytes:
        return await asyncio.wrap_future(self.child.ask("metrics"))

    def health(self) -> dict:
        """The engine's state ("ok", "restarting", "draining", "stopped" or "failed"), its process's pid,
        how often it was restarted and the last exit code of a dead one."""
        with self.lock:
            engine = {"pid": self.child.pid, "restarts": self.restarts, "last_exit_code": self.last_exit_code}
            return {"status": self.state, "engine": engine}

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` once the engine has failed (at once if it already has)."""
        with self.lock:
            self.failure_callback, reason = callback, self.failure
        if reason is not None:
            callback(reason)

    def drain(self) -> None:
        with self.lock:
            if self.state in ("ok", "restarting"):
                self.state = "draining"
            child = self.child
        child.send(("drain",))

    def idle(self) -> bool:
        try:
            return self.child.ask("idle").result(30)
        except Unavailable:
            return True
        except (TimeoutError, FutureTimeout):  # no answer yet: still busy (the two differ before Python 3.11)
            return False

    def stop(self) -> None:
        with self.lock:
            if self.state != "failed":
                self.state = "stopped"
            child = self.child
        child.stop()

    def _supervise(self) -> None:
        """Read each child until its process goes, fail its requests, start the next one."""
        child = self.child
        while child is not None:
            child.read()
            message = self._died(child.process.exitcode)
            child.close(message)
            child = self._restart(message)

    def _restart(self, message: str) -> EngineChild | None:
        """A new child serving in the dead one's place; None where the server stops instead (having told
        ``on_failure``'s callback why, where the engine failed)."""
        while self.state == "restarting":
            self.report(f"the engine process died ({self.cause}); restarting it (restart {self.restarts}, at most {self.allowed} a minute)")
            began = time.monotonic()
            child = EngineChild(self.config)
            with self.lock:
                self.child, stopping = child, self.state == "stopped"  # /health shows its pid; stop() stops it
            if stopping:  # stop() came while it was spawned
                child.stop()
            try:
                child.wait_ready()
            except (ValueError, RuntimeError) as error:  # it exited, refused its configuration or took too long
                message = self._died(child.process.exitcode, "" if isinstance(error, EngineExited) else str(error))
                child.close(message)
                continue
            with self.lock:
                restarted = self.state == "restarting"
                if restarted:
                    self.state, self.startup_seconds = "ok", time.monotonic() - began
            if restarted:
                self.report(f"the engine is back (pid {child.pid}, started in {self.startup_seconds:.1f} s)")
            return child
        with self.lock:
            callback = self.failure_callback if self.state == "failed" else None
        if callback is not None:
            callback(message)
        return None

    def _died(self, exit_code: int | None, error: str = "") -> str:
        """Record a death of the engine's process (``error``: why it failed to start, where its exit code does
        not say) and move to the state it leaves; the message for the requests it ends."""
        now = time.monotonic()
        with self.lock:
            self.last_exit_code, self.cause = exit_code, f"exit code {exit_text(exit_code)}{f': {error}' if error else ''}"
            self.deaths.append((now, exit_code))
            while self.deaths[0][0] < now - RESTART_WINDOW:
                self.deaths.popleft()
            if self.state not in ("ok", "restarting"):
                self.state = "stopped"
                return f"the engine process died ({self.cause})"
            if len(self.deaths) > self.allowed:
                self.state = "failed"
                died = "once" if len(self.deaths) == 1 else f"{len(self.deaths)} times"
                codes = ", ".join(exit_text(code) for _, code in self.deaths)
                self.failure = (
                    f"the engine process died {died} within {RESTART_WINDOW} s (exit codes: {codes}; restarts allowed a minute: "
                    f"{self.allowed}){f'; the last: {error}' if error else ''}"
                )
                return self.failure
            self.state, self.restarts = "restarting", self.restarts + 1
            return f"the engine process died ({self.cause}) and is being restarted: retry in a few seconds"


def serve_engine(requests, events, config: ServeConfig) -> None:
    """The child: load the model, build the engine and run it in this process's main thread while another
    answers the server (``listen``), until the server says stop or goes away. The engine runs in the
    main thread because glibc serves a thread's allocations from heaps of at most 64 MB and maps every
    larger block afresh (its pages faulted in again each time), while the main heap keeps freed blocks
    for reuse (``runtime.retain_freed_memory``): a batch's state tensors grow past 64 MB. Signals are
    the server's to handle: it drains, then stops this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from ..ops.fused_toeplitz import kernels
    from ..runs import open_run
    from ..runtime import retain_freed_memory, set_threads
    from .engine import Engine
    from .servable import check_servable

    retain_freed_memory()
    try:
        set_threads(config.threads)
        run = open_run(config.served, device=config.device)
        check_servable(run, config.served)
        model, tokenizer = run.model, run.tokenizer
        model.precision = config.precision
        engine = Engine(model, tokenizer.token_bytes, config.engine)
    except (ValueError, RuntimeError) as error:
        events.send(("error", str(error)))
        return
    outbox = Outbox(events)
    events.send(("ready", model.config.vocab_size))
    listener = threading.Thread(target=listen, args=(requests, engine, outbox), name="tokenmix-requests", daemon=True)
    listener.start()
    with kernels(config.kernels):  # the process's choice: the engine's thread steps the model
        engine.run(after_step=outbox.flush)


def listen(requests, engine, outbox: Outbox) -> None:
    """Answer the server's messages until it says stop (or goes away), then stop the engine: also when answering
    fails, so that the process ends and the server fails its requests rather than wait on a deaf engine."""
    jobs: dict[int, Job] = {}
    try:
        while True:
            try:
                message = requests.recv()
            except (EOFError, OSError):  # the server went away
                break
            if message[0] == "stop":
                break
            answer_to(message, engine, jobs, outbox)
    finally:
        engine.stop()


class Outbox:
    """The child's events, sent once per iteration, and its answers, sent at once (one pipe, one lock)."""

    def __init__(self, connection):
        self.connection, self.pending, self.lock = connection, [], threading.Lock()

    def post(self, number: int, event) -> None:
        with self.lock:
            self.pending.append((number, event))

    def flush(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
            if pending:
                self._send(("events", pending))

    def answer(self, number: int, value) -> None:
        """After the events already made (an idle engine's last Finished events reach the server first)."""
        with self.lock:
            pending, self.pending = self.pending, []
            if pending:
                self._send(("events", pending))
            self._send(("answer", (number, value)))

    def _send(self, message: tuple) -> None:
        try:
            self.connection.send(message)
        except (BrokenPipeError, OSError):  # the server went away: this process ends when its requests pipe closes
            pass


def answer_to(message: tuple, engine, jobs: dict, outbox: Outbox) -> None:
    kind = message[0]
    if kind == "submit":
        _, question, number, prompt, sampling = message
        job = Job(prompt, sampling, lambda event, number=number: outbox.post(number, event))
        try:
            engine.submit(job)
        except Busy as error:
            outbox.answer(question, ("busy", str(error), error.retry_after))
            return
        except Unavailable as error:
            outbox.answer(question, ("unavailable", str(error), None))
            return
        except ValueError as error:
            outbox.answer(question, ("invalid", str(error), None))
            return
        for finished in [key for key, held in jobs.items() if held.unfinished == 0]:
            del jobs[finished]
        jobs[number] = job
        outbox.answer(question, None)
    elif kind == "cancel":
        job = jobs.pop(message[1], None)
        if job is not None:
            job.cancel()
    elif kind == "metrics":
        outbox.answer(message[1], engine.metrics.text())
    elif kind == "idle":
        outbox.answer(message[1], engine.idle())
    elif kind == "drain":
        engine.drain()
