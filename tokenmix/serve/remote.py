"""The engine in a process of its own, so that the HTTP event loop and the model's thread share no GIL.

In one process, every token the event loop writes (a JSON chunk through the ASGI stack) holds the
GIL the engine's thread needs between two tensor operations: the loop's work and the model's
dispatch run one after the other even on two cores. Here ``EngineProcess`` (in the server) starts
``Engine`` in a child process and talks to it over two pipes: the server sends requests,
cancellations and questions (admission, metrics, idleness); the child answers each question, and
after every iteration sends the events of all its rows in one message.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import signal
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from .engine import Busy, Failed, Finished, Job, Sampling, Unavailable

STARTUP_SECONDS = 600  # loading the model and measuring its state sizes


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


class EngineProcess:
    """The server's side: ``submit`` (awaitable; raises ``Busy``, ``Unavailable`` or ValueError as
    ``Engine.submit`` does), ``cancel``, ``drain``, ``idle``, ``metrics_text``, ``stop``."""

    def __init__(self, settings: dict):
        context = multiprocessing.get_context("spawn")
        self.requests, child_requests = context.Pipe(duplex=False)[::-1]  # (send end here, receive end there)
        child_events, self.events = context.Pipe(duplex=False)[::-1]
        # a daemon: ended at this process's exit whatever happens (a clean stop first asks it to end)
        self.process = context.Process(
            target=serve_engine, args=(child_requests, child_events, settings), name="tokenmix-engine", daemon=True
        )
        self.process.start()
        child_requests.close()
        child_events.close()
        self.accepting, self.stopped = True, False
        self.jobs: dict[int, RemoteJob] = {}
        self.answers: dict[int, Future] = {}
        self.numbers = itertools.count(1)
        self.send_lock, self.state_lock = threading.Lock(), threading.Lock()
        kind, value = self._receive_startup()
        if kind == "error":
            self.process.join(30)
            raise ValueError(value)
        self.vocab_size = value
        threading.Thread(target=self._read, name="tokenmix-engine-events", daemon=True).start()

    def _receive_startup(self):
        if not self.events.poll(STARTUP_SECONDS):
            self.process.kill()
            raise RuntimeError(f"the engine process did not start within {STARTUP_SECONDS} s")
        try:
            return self.events.recv()
        except EOFError:
            raise RuntimeError(f"the engine process exited while starting (exit code {self.process.exitcode})") from None

    def _send(self, message: tuple) -> bool:
        """Whether it went: not once the engine's process is gone (its reader then fails what was running)."""
        try:
            with self.send_lock:
                self.requests.send(message)
        except (BrokenPipeError, OSError):
            return False
        return True

    def _ask(self, question: str, *arguments) -> Future:
        answer: Future = Future()
        with self.state_lock:
            if self.stopped:
                answer.set_exception(Unavailable("the engine has stopped"))
                return answer
            number = next(self.numbers)
            self.answers[number] = answer
        if not self._send((question, number, *arguments)):
            with self.state_lock:
                self.answers.pop(number, None)
            answer.set_exception(Unavailable("the engine has stopped"))
        return answer

    async def submit(self, job: RemoteJob) -> None:
        if not self.accepting:
            raise Unavailable("the engine has stopped" if self.stopped else "the server is shutting down and takes no new requests")
        with self.state_lock:
            job.number = next(self.numbers)
            self.jobs[job.number] = job
        try:
            refusal = await asyncio.wrap_future(self._ask("submit", job.number, job.prompt, job.sampling))
        except BaseException:  # the engine stopped, or the handler was cancelled: nothing runs for it here
            self.cancel(job)
            raise
        if refusal is not None:
            with self.state_lock:
                self.jobs.pop(job.number, None)
            kind, message, retry_after = refusal
            raise {"busy": Busy(message, retry_after), "unavailable": Unavailable(message)}.get(kind, ValueError(message))

    def cancel(self, job: RemoteJob) -> None:
        """The client went away (or the answer is complete): its rows leave at the engine's next iteration."""
        with self.state_lock:
            running = self.jobs.pop(job.number, None) is not None and job.running > 0
        if running:
            self._send(("cancel", job.number))

    async def metrics_text(self) -> bytes:
        return await asyncio.wrap_future(self._ask("metrics"))

    def drain(self) -> None:
        self.accepting = False
        self._send(("drain",))

    def idle(self) -> bool:
        try:
            return self._ask("idle").result(30)
        except Unavailable:
            return True
        except (TimeoutError, FutureTimeout):  # no answer yet: still busy (the two differ before Python 3.11)
            return False

    def stop(self) -> None:
        if self._send(("stop",)):
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()

    def _read(self) -> None:
        """Deliver the child's events and answers until it goes; then every request still running fails."""
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
        self._fail_all(f"the engine process stopped (exit code {self.process.exitcode})")

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

    def _fail_all(self, message: str) -> None:
        with self.state_lock:
            self.accepting, self.stopped = False, True
            jobs, self.jobs = list(self.jobs.values()), {}
            answers, self.answers = list(self.answers.values()), {}
        for answer in answers:
            if not answer.done():
                answer.set_exception(Unavailable(message))
        for job in jobs:
            try:
                job.emit(Failed(message))
            except RuntimeError:  # its event loop is closed: the server is stopping
                pass


def serve_engine(requests, events, settings: dict) -> None:
    """The child: load the model, build the engine and run it in this process's main thread while another
    answers the server (``listen``), until the server says stop or goes away. The engine runs in the
    main thread because glibc serves a thread's allocations from heaps of at most 64 MB and maps every
    larger block afresh (its pages faulted in again each time), while the main heap keeps freed blocks
    for reuse (``runtime.retain_freed_memory``): a batch's state tensors grow past 64 MB. Signals are
    the server's to handle: it drains, then stops this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from ..runtime import retain_freed_memory, set_threads
    from .engine import Engine
    from .loading import load_served

    retain_freed_memory()
    try:
        set_threads(settings["threads"])
        model, tokenizer, _ = load_served(settings["served"], settings["device"])
        model.precision = settings["precision"]
        engine = Engine(model, tokenizer.token_bytes, **settings["engine"])
    except (ValueError, RuntimeError) as error:
        events.send(("error", str(error)))
        return
    outbox = Outbox(events)
    events.send(("ready", model.config.vocab_size))
    listener = threading.Thread(target=listen, args=(requests, engine, outbox), name="tokenmix-requests", daemon=True)
    listener.start()
    engine.run(after_iteration=outbox.flush)


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
