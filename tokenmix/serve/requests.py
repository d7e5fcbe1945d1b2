"""The body of ``POST /v1/completions`` read into engine jobs, every field checked (OpenAI's format).

A bad field is an ``ApiError`` that names it (``param``) and says what is accepted; it becomes an
HTTP 400 with an OpenAI-style JSON error, and the server goes on.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from .jobs import Sampling

MAX_STOPS = 4
MAX_LOGPROBS = 20
MAX_SEED = 2**63 - 1
IGNORED_AT = {"echo": False, "presence_penalty": 0, "frequency_penalty": 0, "suffix": None, "logit_bias": None}  # only their no-op values


class ApiError(Exception):
    """An error answered in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers or {}

    def body(self) -> dict:
        kind = self.TYPES.get(self.status, "server_error" if self.status >= 500 else "rate_limit_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (``tokenmix serve`` options)."""

    max_request_bytes: int = 1_000_000
    max_prompt_tokens: int = 4096
    max_tokens: int = 1024
    max_choices: int = 16


@dataclass
class Completion:
    """A parsed request: its prompts' ids, one ``Sampling`` for all, and how to answer."""

    prompts: list[list[int]]
    sampling: Sampling
    stream: bool
    include_usage: bool


def _number(body: dict, name: str, default, low: float, high: float, integer: bool = False, open_low: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or value != value:
        raise ApiError(400, f"{name} must be {kind}, got {json.dumps(value)[:40]}", name)
    if value < low or value > high or (open_low and value == low):
        bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise ApiError(400, f"{name} must be {kind} in {bounds}, got {value}", name)
    return value


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompts(value, tokenizer, vocab_size: int, limits: Limits) -> list[list[int]]:
    """A string, a list of strings, a list of token ids or a list of such lists, as id lists."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(_is_id(item) for item in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "prompt must be a non-empty string, a list of strings, or token ids", "prompt")
    prompts = []
    for item in value:
        if isinstance(item, str):
            ids = tokenizer.encode(item).tolist()
        elif isinstance(item, list) and all(_is_id(i) and 0 <= i < vocab_size for i in item):
            ids = list(item)
        else:
            raise ApiError(400, f"prompt must hold strings or lists of token ids in [0, {vocab_size})", "prompt")
        if not ids:
            raise ApiError(400, "prompt must not be empty: the model continues at least one token", "prompt")
        if len(ids) > limits.max_prompt_tokens:
            raise ApiError(400, f"prompt is {len(ids)} tokens; this server takes at most {limits.max_prompt_tokens}", "prompt")
        prompts.append(ids)
    return prompts


def _stops(value) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOPS or not all(isinstance(stop, str) and stop for stop in stops):
        raise ApiError(400, f"stop must be a non-empty string or a list of 1 to {MAX_STOPS} of them", "stop")
    return tuple(stops)


KNOWN = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n", "best_of", "stream"}
KNOWN |= {"stream_options", "logprobs", "user", *IGNORED_AT}


def parse_completion(raw: bytes, model_id: str, tokenizer, vocab_size: int, limits: Limits) -> Completion:
    """The request ``raw`` (the HTTP body) as a ``Completion``, or an ``ApiError`` naming what is wrong."""
    if len(raw) > limits.max_request_bytes:
        raise ApiError(413, f"the request body is {len(raw)} bytes; this server takes at most {limits.max_request_bytes}")
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ApiError(400, f"the request body is not UTF-8: {error}") from None
    except json.JSONDecodeError as error:
        raise ApiError(400, f"the request body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise ApiError(400, f"unknown parameter {unknown[0]!r}; accepted: {', '.join(sorted(KNOWN))}", unknown[0])
    for name, neutral in IGNORED_AT.items():
        if body.get(name, neutral) not in (neutral, None):
            raise ApiError(400, f"{name} is not supported here (only {json.dumps(neutral)})", name)
    if body.get("model", model_id) != model_id:
        served = f"model {str(body['model'])[:80]!r} is not served here; this server serves {model_id!r}"
        raise ApiError(404, served, "model", "model_not_found")
    if "prompt" not in body:
        raise ApiError(400, "prompt is required", "prompt")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError(400, "stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"} or not isinstance(options.get("include_usage", False), bool):
        raise ApiError(400, 'stream_options must be {"include_usage": true or false}', "stream_options")
    n = _number(body, "n", 1, 1, limits.max_choices, integer=True)
    if body.get("best_of") not in (None, n):
        raise ApiError(400, "best_of is not supported here (only equal to n)", "best_of")
    logprobs = body.get("logprobs")
    sampling = Sampling(
        max_tokens=_number(body, "max_tokens", 16, 1, limits.max_tokens, integer=True),
        temperature=float(_number(body, "temperature", 1.0, 0, 2)),
        top_k=_number(body, "top_k", 0, 0, vocab_size, integer=True) or None,
        top_p=float(_number(body, "top_p", 1.0, 0, 1, open_low=True)),
        seed=_number(body, "seed", None, 0, MAX_SEED, integer=True) if body.get("seed") is not None else secrets.randbelow(MAX_SEED),
        stop=_stops(body.get("stop")),
        logprobs=None if logprobs is None else _number(body, "logprobs", None, 0, MAX_LOGPROBS, integer=True),
        n=n,
    )
    prompts = _prompts(body["prompt"], tokenizer, vocab_size, limits)
    return Completion(prompts, sampling, body.get("stream", False), options.get("include_usage", False))
