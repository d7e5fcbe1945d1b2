"""The ASGI app of ``tokenmix serve`` (FastAPI): OpenAI-compatible completions over one ``Engine``.

``POST /v1/completions`` (server-sent events when ``stream`` is true), ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus text) and a page at ``/`` to try the model. With an
API key, /v1/* and /metrics need ``Authorization: Bearer KEY``. Every error is OpenAI's JSON
error object with its HTTP status; the engine runs in its own process (``remote.py``) and reaches
a request's handler through an asyncio queue.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
import weakref
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from .jobs import Busy, Failed, Token, Unavailable
from .remote import EngineProcess, EngineStopped, RemoteJob, Restarting
from .requests import ApiError, Completion, Limits, parse_completion

DISCONNECT_POLL = 0.5  # seconds between checks that a non-streaming client is still there


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, read no further than ``limit`` bytes past which it is refused (413)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes; this server takes at most {limit}")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise ApiError(413, f"the request body is more than {limit} bytes; this server takes at most {limit}")
    return bytes(body)


class Mailbox:
    """Events from the engine's thread to the requests' queues on their event loop, with one wake-up of
    the loop for all the events posted while it was busy (an iteration posts one per running row)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.pending, self.lock = loop, [], threading.Lock()

    def post(self, queue: asyncio.Queue, item) -> None:
        """Called from the engine's thread; RuntimeError once the loop is closed (the server is stopping)."""
        with self.lock:
            self.pending.append((queue, item))
            wake = len(self.pending) == 1
        if wake:
            try:
                self.loop.call_soon_threadsafe(self.deliver)
            except RuntimeError:
                with self.lock:
                    self.pending.clear()  # nobody will read them; later posts fail alike instead of piling up
                raise

    def deliver(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        for queue, item in pending:
            queue.put_nowait(item)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def failure(event: Failed) -> ApiError:
    """A failed request's error: 503 where the engine's process died under it (a retry is served once it is
    restarted), 500 where the model failed."""
    if isinstance(event, EngineStopped):
        return ApiError(503, event.message, code="engine_stopped")
    return ApiError(500, event.message, code="engine_error")


class Choices:
    """The answer being built: each choice's text, finish reason and logprobs, and the usage."""

    def __init__(self, completion: Completion):
        self.n = completion.sampling.n
        count = len(completion.prompts) * self.n
        self.text, self.reason = [""] * count, [None] * count
        self.logprobs = [{"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []} for _ in range(count)]
        self.prompt_tokens, self.completion_tokens = sum(map(len, completion.prompts)), 0  # each prompt once, as OpenAI counts

    def add(self, index: int, event) -> dict:
        """Record ``event`` of choice ``index``; returns that choice's streamed chunk."""
        logprobs = None
        if isinstance(event, Token):
            self.completion_tokens += 1
            if event.logprobs is not None:
                logprobs = {
                    "tokens": [event.logprobs["token"]],
                    "token_logprobs": [event.logprobs["logprob"]],
                    "top_logprobs": [event.logprobs["top"]],
                    "text_offset": [event.logprobs["offset"]],
                }
                for key, values in logprobs.items():
                    self.logprobs[index][key] += values
        else:
            self.reason[index] = event.reason
        self.text[index] += event.text
        return {"text": event.text, "index": index, "logprobs": logprobs, "finish_reason": self.reason[index]}

    def usage(self) -> dict:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}


class Authorization:
    """Checks ``Authorization: Bearer KEY`` where the server has an API key (401 otherwise)."""

    def __init__(self, api_key: str | None):
        self.api_key = api_key

    def __call__(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise ApiError(401, "a valid API key is required: send the header Authorization: Bearer KEY", code="invalid_api_key")


class Completions:
    """``POST /v1/completions``: a request's prompts submitted to ``engine`` as jobs, their events collected
    into one answer or streamed as server-sent events."""

    def __init__(self, engine: EngineProcess, tokenizer, model_id: str, limits: Limits):
        self.engine, self.tokenizer, self.model_id, self.limits = engine, tokenizer, model_id, limits
        self.mailboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # by event loop: the server's one (tests may run others)

    async def answer(self, request: Request):
        limits = self.limits
        raw = await read_body(request, limits.max_request_bytes)
        completion = parse_completion(raw, self.model_id, self.tokenizer, self.engine.vocab_size, limits)
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        mailbox = self.mailboxes.get(loop) or self.mailboxes.setdefault(loop, Mailbox(loop))
        jobs = []
        for base, prompt in enumerate(completion.prompts):

            def emit(event, base=base * completion.sampling.n):
                mailbox.post(events, (base, event))

            jobs.append(RemoteJob(prompt, completion.sampling, emit))
        await self.submit(jobs)
        answer = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": self.model_id}
        choices = Choices(completion)
        if completion.stream:
            return StreamingResponse(self.stream(jobs, events, answer, choices, completion.include_usage), media_type="text/event-stream")
        try:
            await self.collect(request, events, choices)
        finally:
            for job in jobs:
                self.engine.cancel(job)  # no-op for finished jobs; frees the rows of a client that went away
        answer["choices"] = [
            {
                "text": choices.text[i],
                "index": i,
                "logprobs": choices.logprobs[i] if completion.sampling.logprobs is not None else None,
                "finish_reason": choices.reason[i],
            }
            for i in range(len(choices.text))
        ]
        return {**answer, "usage": choices.usage()}

    async def submit(self, jobs: list[RemoteJob]) -> None:
        for index, job in enumerate(jobs):
            try:
                await self.engine.submit(job)
            except (Busy, Unavailable, ValueError) as error:
                for earlier in jobs[:index]:
                    self.engine.cancel(earlier)
                if isinstance(error, Busy):
                    raise ApiError(429, str(error), code="server_full", headers={"Retry-After": str(error.retry_after)}) from None
                if isinstance(error, Restarting):
                    raise ApiError(503, str(error), code="engine_restarting", headers={"Retry-After": str(error.retry_after)}) from None
                if isinstance(error, Unavailable):
                    raise ApiError(503, str(error), code="shutting_down") from None
                raise ApiError(400, str(error), "max_tokens") from None

    @staticmethod
    async def next_event(events: asyncio.Queue, timeout: float):
        base, event = await asyncio.wait_for(events.get(), timeout)
        if isinstance(event, Failed):
            raise failure(event)
        return base, event

    async def collect(self, request: Request, events: asyncio.Queue, choices: Choices) -> None:
        while None in choices.reason:
            try:
                base, event = await self.next_event(events, DISCONNECT_POLL)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return
                continue
            choices.add(base + event.choice, event)

    async def stream(self, jobs: list[RemoteJob], events: asyncio.Queue, answer: dict, choices: Choices, include_usage: bool):
        """One event per token; the events that came while the last were sent go out in one write."""
        head = json.dumps(answer)[:-1] + ', "choices": ['  # the answer's fields, then each chunk's choice
        try:
            while None in choices.reason:
                pending = [await events.get()]
                while not events.empty():
                    pending.append(events.get_nowait())
                lines = []
                for base, event in pending:
                    if isinstance(event, Failed):
                        yield "".join(lines) + f"data: {json.dumps(failure(event).body())}\n\n"
                        return
                    lines.append(f"data: {head}{json.dumps(choices.add(base + event.choice, event))}]}}\n\n")
                yield "".join(lines)
            if include_usage:
                yield f"data: {json.dumps({**answer, 'choices': [], 'usage': choices.usage()})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            for job in jobs:
                self.engine.cancel(job)  # a client that disconnects mid-stream frees its rows at the next iteration


def add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON error object with its status."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return error_response(error)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        return error_response(ApiError(error.status_code, f"{request.method} {request.url.path}: {error.detail}"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        return error_response(ApiError(400, str(error)))


def add_info_routes(app: FastAPI, engine: EngineProcess, model_id: str, authorize: Authorization) -> None:
    """``/health``, ``/metrics`` (the engine's process's and this one's), ``/v1/models`` and the page at ``/``."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

    created = int(time.time())
    own = CollectorRegistry()  # this process's CPU and memory; the engine's process reports its own
    ProcessCollector(namespace="tokenmix_http", registry=own)

    @app.get("/health")
    async def health():
        report = engine.health()
        return JSONResponse(report, status_code=200 if report["status"] == "ok" else 503)

    @app.get("/metrics")
    async def metrics(request: Request):
        authorize(request)
        try:
            text = await engine.metrics_text() + generate_latest(own)
        except Unavailable as error:
            raise ApiError(503, str(error), code="engine_unavailable") from None
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created, "owned_by": "tokenmix"}]}

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8").replace("{{MODEL}}", model_id)


def create_app(engine: EngineProcess, tokenizer, model_id: str, *, api_key: str | None = None, limits: Limits | None = None) -> FastAPI:
    """The app serving ``engine`` (started and stopped by the caller) as model ``model_id``."""
    app = FastAPI(title="tokenmix serve", docs_url=None, redoc_url=None, openapi_url=None)
    authorize = Authorization(api_key)
    add_error_handlers(app)
    add_info_routes(app, engine, model_id, authorize)
    completions = Completions(engine, tokenizer, model_id, limits or Limits())

    @app.post("/v1/completions")
    async def complete(request: Request):
        authorize(request)
        return await completions.answer(request)

    return app
