"""``tokenmix serve``: an OpenAI-compatible HTTP server for a causal LM run or export (docs/serve.md)."""

from __future__ import annotations

import os
import sys
import threading
import time

import torch

from ..devices import resolve_device
from ..errors import user_input
from ..fields import Existing, Integer, Number, Text
from ..generation.graphs import use_static_decoding
from ..runs import open_run
from ..runtime import available_cpus, release_freed_memory, set_threads
from ..serve.servable import check_servable
from .arguments import ByteSize
from .common import add_decoding, add_kernels, add_precision, add_threads_and_device

API_KEY_VARIABLE = "TOKENMIX_API_KEY"
DEFAULT_CHOICES = 16
ENGINE_RESTARTS = 2  # a minute: a third death of the engine within one stops the server
SERVE_EXTRA = 'tokenmix serve needs its optional extra: pip install "tokenmix[serve]"'


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="serve a causal LM over HTTP: OpenAI-compatible completions with continuous batching")
    served = "a run directory, checkpoint.pt or export-hf folder"
    parser.add_argument("checkpoint", type=Existing(served), help=served)
    parser.add_argument(
        "--host", type=Text("an address"), default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)"
    )
    parser.add_argument("--port", type=Integer(0, 65535), default=8000, help="port (default: 8000; 0 picks a free one)")
    parser.add_argument("--max-batch", type=Integer(1), default=64, help="sequences decoded at once at most (default: 64)")
    parser.add_argument(
        "--max-state-memory",
        type=ByteSize(),
        default=2 * 10**9,
        help="bytes the sequences' states and the prefix cache may hold; past it requests get 429 (default: 2GB)",
    )
    parser.add_argument(
        "--api-key", type=Text("a key"), help=f"require Authorization: Bearer KEY (default: ${API_KEY_VARIABLE} if set, else no key)"
    )
    parser.add_argument("--model-name", type=Text("a model name"), help="the model's id in the API (default: the run's folder name)")
    parser.add_argument("--max-prompt-tokens", type=Integer(1), default=4096, help="longest prompt in tokens (default: 4096)")
    parser.add_argument("--max-tokens", type=Integer(1), default=1024, help="largest max_tokens a request may ask (default: 1024)")
    parser.add_argument(
        "--max-choices", type=Integer(1), default=None, help="largest n a request may ask (default: 16, or --max-batch if smaller)"
    )
    parser.add_argument("--max-request-bytes", type=ByteSize(), default=10**6, help="largest request body (default: 1MB)")
    parser.add_argument(
        "--chunk", type=Integer(1), default=512, help="prompt tokens read per scheduler iteration, so others keep decoding (default: 512)"
    )
    parser.add_argument(
        "--prefix-cache-min",
        type=Integer(0),
        default=64,
        help="prompts at least this long keep their state for requests that start with them; 0 turns the cache off (default: 64)",
    )
    parser.add_argument(
        "--drain-timeout", type=Number(0), default=30.0, help="seconds SIGTERM waits for running requests to finish (default: 30)"
    )
    parser.add_argument(
        "--engine-restarts",
        type=Integer(0),
        default=ENGINE_RESTARTS,
        help=f"restarts of a dead engine process allowed a minute; one more death stops the server with status 1 "
        f"(default: {ENGINE_RESTARTS}; 0 stops it at the first, as vLLM does)",
    )
    add_threads_and_device(parser, threads_default="torch's, at most one fewer than the CPUs: one core is left to the HTTP server")
    add_precision(parser)
    add_kernels(parser)
    add_decoding(parser)
    parser.add_argument(
        "--prefill-threads",
        type=Integer(1),
        default=None,
        help="threads that read a batch of prompts (one parallel forward, in bursts) (default: the CPUs this process may use)",
    )
    parser.set_defaults(handler=run_serve)


class DrainingServer:
    """uvicorn's server whose SIGTERM / SIGINT drain the engine first: new requests get 503, running ones
    finish (up to ``deadline`` seconds), then the server stops. It stops too when the engine fails
    (``failure`` says why)."""

    def __init__(self, config, engine, deadline: float):
        import uvicorn

        self.engine, self.deadline, self.draining, self.failure = engine, deadline, False, None
        self.server = uvicorn.Server(config)
        self.server.handle_exit = self.handle_exit
        engine.on_failure(self.fail)

    def fail(self, reason: str) -> None:
        self.failure = reason
        self.server.should_exit = True

    def handle_exit(self, sig, frame) -> None:
        """Runs on the event loop's thread between two of its steps: it only starts the drain's thread (which
        talks to the engine: the interrupted step may hold the engine's pipe)."""
        if self.draining:  # a second signal: stop now
            self.server.should_exit = True
            return
        self.draining = True
        say(f"draining (up to {self.deadline:g} s) before exit")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        self.engine.drain()
        end = time.monotonic() + self.deadline
        while not self.engine.idle() and time.monotonic() < end:
            time.sleep(0.05)
        self.server.should_exit = True

    def run(self) -> None:
        self.server.run()


def run_serve(args) -> int:
    with user_input():
        try:
            import uvicorn

            from ..serve.app import create_app
            from ..serve.remote import EngineProcess
            from ..serve.requests import Limits
        except ImportError:
            raise ValueError(SERVE_EXTRA) from None
        threads = args.threads or max(1, min(torch.get_num_threads(), available_cpus() - 1))  # a core for the HTTP loop
        set_threads(threads)  # warns here when there are more threads than CPUs; the engine's process uses as many
        run = open_run(args.checkpoint)  # a wrong path or model is refused before that process starts
        check_servable(run, args.checkpoint)
        device = resolve_device(args.device)
        static = use_static_decoding(run.model, args.decoding, device)  # refuses static where the model lacks it
        tokenizer, name = run.tokenizer, run.name
        del run
        release_freed_memory()  # the weights loaded here for the check: the engine's process loads its own
        if args.max_choices is None:
            args.max_choices = min(DEFAULT_CHOICES, args.max_batch)
        limits = Limits(args.max_request_bytes, args.max_prompt_tokens, args.max_tokens, args.max_choices)
        if args.max_choices > args.max_batch:
            raise ValueError(f"--max-choices ({args.max_choices}) must be at most --max-batch ({args.max_batch})")
        api_key = args.api_key or os.environ.get(API_KEY_VARIABLE) or None
        config = serve_config(args, threads)  # --kernels fused refused here where it cannot run
    decoding = "their streams" if not static else "from static buffers" + (" as CUDA graphs" if device.type == "cuda" else "")
    say(f"measuring state sizes up to {config.engine.context} tokens; batches decode {decoding}")
    with user_input():
        engine = EngineProcess(config, restarts=args.engine_restarts, report=say)
    app = create_app(engine, tokenizer, args.model_name or name, api_key=api_key, limits=limits)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    server = DrainingServer(config, engine, args.drain_timeout)
    announce = threading.Thread(target=_announce, args=(server.server, api_key is not None), daemon=True)
    announce.start()
    try:
        server.run()
    finally:
        engine.stop()
    if server.failure is not None:  # one line, and a status a supervisor restarts the server on
        say(f"error: {server.failure}")
        return 1
    return 0


def serve_config(args, threads: int):
    """The engine process's ``ServeConfig`` from the command's options."""
    from ..serve.config import EngineConfig, ServeConfig

    engine = EngineConfig(
        context=args.max_prompt_tokens + args.max_tokens,
        max_batch=args.max_batch,
        max_state_memory=args.max_state_memory,
        chunk=args.chunk,
        prefix_min=args.prefix_cache_min,
        prefill_threads=args.prefill_threads or available_cpus(),
        decoding=args.decoding,
    )
    return ServeConfig(args.checkpoint, args.device, args.precision, threads, engine, kernels=args.kernels)


def say(line: str) -> None:
    print(f"tokenmix serve: {line}", file=sys.stderr, flush=True)


def _announce(server, keyed: bool) -> None:
    """Print the address once the server listens (with ``--port 0``, the port it got)."""
    while not server.started:
        time.sleep(0.02)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    say(f"listening on http://{host}:{port}{' (API key required)' if keyed else ''}")
