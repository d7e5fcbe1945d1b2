"""``tokenmix bench --kinds serve``: the real server, driven over HTTP by concurrent streaming clients.

For each model (untrained weights at the demo's shape: the speed does not depend on them) the
bench writes it as a ``save_pretrained`` folder with the byte tokenizer, starts ``tokenmix serve``
on it in a child process and, for each concurrency c, runs rounds (``_round``): c clients each send
``--serve-requests`` streaming requests one after another (prompts of 16-128 random tokens, new ones
each round, ``--serve-tokens`` new tokens, sampled with their own seeds); then, with the server
idle, the same prompts go through ``tokenmix.generate`` in this process with ``--threads`` threads:
c at once (the model's own batched decoding, no HTTP) and ``SEQUENTIAL_MAX`` prompts one at a time.
A first round warms up; of the ``--repeats`` rounds after it each rate is the median (the machine's
load moves single runs by a quarter; each round's rates are kept beside it). The clients run in a
child process. The server, as by default, decodes with one thread fewer and
leaves that core to its HTTP event loop (and the clients): the same cores in all. With
``--server-cpus`` (Linux), the server and this process run on those CPUs and the clients on the
others, and the server decodes with ``--threads`` threads, as the in-process decoding does.
Then a prompt of ``PREFIX_PROMPT`` tokens is sent twice (the second
resumes from the prefix cache), and a flood of ``FLOOD_REQUESTS`` requests at once hits a server
with a small ``--max-state-memory``.

Records: ``serve`` (throughput and latency percentiles per concurrency, with the in-process
rates), ``serve_prefix`` (first and second time to first token) and ``serve_flood`` (how each
request ended, and the most the states held against the budget).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from ..data.tokenizer import byte_tokenizer
from ..generation import generate
from ..io.table import format_table
from ..models.model import build_model
from ..runtime import pin_process, pinned, set_threads, usable_cpus
from ..serve import ENGINE_PHASES

SERVE_KINDS = ("serve", "serve_prefix", "serve_flood")
SERVE = {"models": ["tnn", "tcnca", "mega", "transformer"], "concurrency": [1, 4, 16, 64], "model_dim": 128, "depth": 4, "repeats": 3}
VOCAB = 256  # byte-level, as the demo
PROMPT_LENGTHS = (16, 128)
PREFIX_PROMPT = 4096
FLOOD_REQUESTS = 500
FLOOD_MEMORY_ROWS = 8  # the flood's --max-state-memory: this many rows at FLOOD_ROW_TOKENS
FLOOD_ROW_TOKENS = 512
SEQUENTIAL_MAX = 16  # requests run one at a time for the baseline (its rate does not depend on how many)
PROMPT_SEEDS = 10  # the rounds' prompts: seeds 10, 11, ... (the prefix test's is 1, the flood's 2)
PERCENTILES = (50, 95, 99)


def percentile(values: list[float], share: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share / 100 * len(ordered) + 0.5) - 1))]


def prompts_for(count: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(PROMPT_LENGTHS[0], PROMPT_LENGTHS[1] + 1, (count,), generator=generator)
    return [torch.randint(0, VOCAB, (int(length),), generator=generator).tolist() for length in lengths]


TOKEN_EVENT = b'"finish_reason": null}]}\n\n'  # how each server-sent token event ends (one choice, as the bench asks)


async def _stream(http, url: str, request: dict) -> dict:
    """One streaming request: when it was sent, its first token came, it ended, and its tokens.

    Token events are counted in the bytes as they come, without parsing each one's JSON: a client
    costs the CPU its clients share with the server on one machine as little as it can."""
    sent, first, tokens, rest = time.perf_counter(), None, 0, b""
    async with http.stream("POST", f"{url}/v1/completions", json=request) as response:
        if response.status_code != 200:
            return {"status": response.status_code, "sent": sent}
        async for part in response.aiter_raw():
            complete, separator, rest = (rest + part).rpartition(b"\n\n")
            tokens += (complete + separator).count(TOKEN_EVENT)
            first = first or (time.perf_counter() if tokens else None)
    return {"status": 200, "sent": sent, "first": first, "end": time.perf_counter(), "tokens": tokens}


def run_clients(url: str, prompts: list[list[int]], concurrency: int, new_tokens: int) -> dict:
    """``_clients`` run to the end: their ``results``, the ``seconds`` they took, the ``cpu_seconds`` this
    process used meanwhile and the ``cpus`` it ran on."""
    cpu = time.process_time()
    results, seconds = asyncio.run(_clients(url, prompts, concurrency, new_tokens))
    return {"results": results, "seconds": seconds, "cpu_seconds": time.process_time() - cpu, "cpus": sorted(usable_cpus())}


async def _clients(url: str, prompts: list[list[int]], concurrency: int, new_tokens: int) -> tuple[list[dict], float]:
    """``concurrency`` clients sharing ``prompts`` in turn, each request after the client's previous one.

    Each client has its own connection pool, as clients on other machines would: in one shared pool,
    httpx looks over every connection for every request and every read (quadratic in the clients;
    profiled at 64 clients, it delayed their next requests by hundreds of milliseconds)."""
    import ssl

    import httpx

    tls = ssl.create_default_context()  # made once: each client making its own takes ~15 ms

    async def client(index: int) -> list[dict]:
        done = []
        async with httpx.AsyncClient(timeout=600, verify=tls) as http:
            for number in range(index, len(prompts), concurrency):
                request = {"prompt": prompts[number], "max_tokens": new_tokens, "stream": True, "temperature": 0.8, "seed": number}
                done.append(await _stream(http, url, request))
        return done

    start = time.perf_counter()
    results = await asyncio.gather(*(client(index) for index in range(concurrency)))
    return [result for done in results for result in done], time.perf_counter() - start


def _generate_rate(model, prompts: list[list[int]], new_tokens: int, batch: int) -> float:
    """Tokens per second of ``tokenmix.generate`` over ``prompts``, ``batch`` at a time (the server idle)."""
    start = time.perf_counter()
    for first in range(0, len(prompts), batch):
        group = [torch.tensor(prompt) for prompt in prompts[first : first + batch]]
        generate(model, group, new_tokens, temperature=0.8, seed=first)
    return len(prompts) * new_tokens / (time.perf_counter() - start)


def _latencies(results: list[dict]) -> dict:
    first = [result["first"] - result["sent"] for result in results]
    per_token = [(result["end"] - result["first"]) / (result["tokens"] - 1) for result in results if result["tokens"] > 1]
    record = {f"ttft_p{share}_ms": 1000 * percentile(first, share) for share in PERCENTILES}
    return record | {f"tpot_p{share}_ms": 1000 * percentile(per_token, share) for share in PERCENTILES}


def _saved_model(name: str, args, folder: Path):
    torch.manual_seed(0)
    model = build_model(name, task="lm", vocab_size=VOCAB, dim=args.model_dim, depth=args.depth).eval()
    model.save_pretrained(folder)
    byte_tokenizer().save(folder)
    return model


class ClientsProcess:
    """A child process that runs the clients (on ``cpus``, or wherever this process may run when None),
    so that their CPU time is theirs alone and, pinned, they leave the server's CPUs to it."""

    def __init__(self, cpus: list[int] | None):
        context = multiprocessing.get_context("spawn")
        pinning = {"initializer": pin_process, "initargs": (cpus,)} if cpus else {}
        self.pool = ProcessPoolExecutor(max_workers=1, mp_context=context, **pinning)

    def run(self, function, *args):
        return self.pool.submit(function, *args).result()

    def __enter__(self) -> ClientsProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown()


def _client_cpus(server_cpus: list[int] | None) -> list[int] | None:
    """The CPUs left to the clients when the server runs on ``server_cpus`` (None: not pinned)."""
    if server_cpus is None:
        return None
    left = sorted(usable_cpus() - set(server_cpus))
    if not left:
        raise ValueError(f"--server-cpus must leave at least one of this process's CPUs {sorted(usable_cpus())} to the clients")
    return left


def serve_records(args, revision: str | None, keep) -> list[dict]:
    """Every model's records (``keep`` gets them as they come)."""
    client_cpus = _client_cpus(args.server_cpus)
    with pinned(args.server_cpus), ClientsProcess(client_cpus) as clients:
        set_threads(args.threads)
        return _records(args, revision, keep, clients)


def _records(args, revision: str | None, keep, clients: ClientsProcess) -> list[dict]:
    from ..serve.launch import ServerProcess
    from ..serve.memory import StateSizes

    records: list[dict] = []
    # as ``tokenmix serve`` by default: one core left to its HTTP event loop and, unpinned, to the clients
    server_threads = args.threads if args.server_cpus else max(1, args.threads - 1)
    common = {"threads": args.threads, "server_threads": server_threads, "dim": args.model_dim, "depth": args.depth, "git_commit": revision}
    common |= {"repeats": args.repeats}
    flags = ["--threads", str(server_threads), "--max-batch", str(max(args.concurrency)), "--max-prompt-tokens", str(PREFIX_PROMPT)]
    flags += ["--max-tokens", str(args.serve_tokens)]
    for name in args.models:
        with tempfile.TemporaryDirectory() as folder:
            model = _saved_model(name, args, Path(folder))
            with ServerProcess(folder, *flags) as server:
                seeds = itertools.count(PROMPT_SEEDS)
                for concurrency in args.concurrency:
                    rounds = [_round(server.url, model, clients, concurrency, args, next(seeds)) for _ in range(1 + args.repeats)]
                    record = {"kind": "serve", "model": name, "concurrency": concurrency, **_summary(rounds[1:]), **common}
                    records.append(record | {"server_cpus": sorted(usable_cpus(server.process.pid))})
                    keep(records)
                records.append({"kind": "serve_prefix", "model": name, **clients.run(_prefix, server.url), **common})
                keep(records)
            flood_budget = FLOOD_MEMORY_ROWS * StateSizes(model, PREFIX_PROMPT + args.serve_tokens, "cpu").at(FLOOD_ROW_TOKENS)
            flood = _flood(folder, flags, args.serve_tokens, flood_budget, clients)
            records.append({"kind": "serve_flood", "model": name, **flood, **common})
            keep(records)
    return records


def _round(url: str, model, clients: ClientsProcess, concurrency: int, args, seed: int) -> dict:
    """One measurement: ``concurrency`` clients served over HTTP, then, with the server idle, the same
    prompts through ``tokenmix.generate`` batched and ``SEQUENTIAL_MAX`` of them one at a time. Every
    round has prompts of its own (``seed``): none is in the server's prefix cache, as none of the
    batched baseline's is."""
    prompts = prompts_for(max(concurrency * args.serve_requests, SEQUENTIAL_MAX), seed)
    served = prompts[: concurrency * args.serve_requests]
    before = _server_seconds(url)
    run = clients.run(run_clients, url, served, concurrency, args.serve_tokens)
    after = _server_seconds(url)
    tokens = sum(result["tokens"] for result in run["results"])
    found = {"results": run["results"], "tokens": tokens, "seconds": run["seconds"], "tokens_per_second": tokens / run["seconds"]}
    found |= {f"engine_{phase}_seconds": after[phase] - before[phase] for phase in ENGINE_PHASES}
    found |= {
        "server_cpu_seconds": _difference(after["cpu"], before["cpu"]),
        "clients_cpu_seconds": run["cpu_seconds"],
        "client_cpus": run["cpus"],
    }
    found["batched_tokens_per_second"] = _generate_rate(model, served, args.serve_tokens, concurrency)
    found["sequential_tokens_per_second"] = _generate_rate(model, prompts[:SEQUENTIAL_MAX], args.serve_tokens, 1)
    return found


def _summary(rounds: list[dict]) -> dict:
    """The rounds as one record: each rate the median over the rounds (of an even count, the lower middle
    one: a round's own rate), each round's beside it (``*_runs``); the served run's time, phases and CPU
    seconds those of the round with the median served rate; the latency percentiles over every request
    of every round."""
    rates = ("tokens_per_second", "batched_tokens_per_second", "sequential_tokens_per_second")
    middle = sorted(rounds, key=lambda found: found["tokens_per_second"])[(len(rounds) - 1) // 2]
    record = {key: value for key, value in middle.items() if key not in ("results", *rates)}
    record["requests"] = len(middle["results"])
    for rate in rates:
        record[rate] = statistics.median_low(found[rate] for found in rounds)
        record[f"{rate}_runs"] = [found[rate] for found in rounds]
    return record | _latencies([result for found in rounds for result in found["results"]])


def _prefix(url: str) -> dict:
    """Time to first token of a long prompt, then of the same prompt again (resumed from the cache)."""
    prompt = prompts_for(1, seed=1)[0] * (PREFIX_PROMPT // PROMPT_LENGTHS[0])
    prompt = prompt[:PREFIX_PROMPT]

    async def twice():
        import httpx

        async with httpx.AsyncClient(timeout=600) as http:
            return [await _stream(http, url, {"prompt": prompt, "max_tokens": 2, "stream": True, "seed": 0}) for _ in range(2)]

    first, second = asyncio.run(twice())
    ttft = [(result["first"] - result["sent"]) * 1000 for result in (first, second)]
    return {"prompt_tokens": len(prompt), "first_ttft_ms": ttft[0], "second_ttft_ms": ttft[1], "speedup": ttft[0] / ttft[1]}


def _flood(folder: str, flags: list[str], new_tokens: int, budget: int, clients: ClientsProcess) -> dict:
    """``FLOOD_REQUESTS`` requests at once against a server with ``--max-state-memory`` ``budget``."""
    import httpx

    from ..serve.launch import ServerProcess

    with ServerProcess(folder, *flags, "--max-state-memory", str(budget)) as server:
        run = clients.run(run_clients, server.url, prompts_for(FLOOD_REQUESTS, seed=2), FLOOD_REQUESTS, new_tokens)
        results, seconds = run["results"], run["seconds"]
        metrics = httpx.get(f"{server.url}/metrics").text
    statuses = [result["status"] for result in results]
    complete = sum(1 for result in results if result["status"] == 200 and result["tokens"] == new_tokens)
    return {
        "requests": len(results),
        "completed": complete,
        "refused_429": statuses.count(429),
        "lost": len(results) - complete - statuses.count(429),
        "budget_bytes": budget,
        "peak_state_bytes": int(_metric(metrics, "tokenmix_state_bytes_peak")),
        "seconds": seconds,
    }


def _metric(text: str, name: str) -> float | None:
    """The value of the sample ``name`` (with its labels, as the text format writes them) in ``text``; None if absent."""
    line = next((line for line in text.splitlines() if line.startswith(name + " ")), None)
    return None if line is None else float(line.split()[-1])


def _difference(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def _server_seconds(url: str) -> dict[str, float | None]:
    """The server's ``tokenmix_engine_seconds`` by phase so far, and the CPU seconds of its two processes ("cpu":
    the engine's ``process_cpu_seconds_total`` and the HTTP one's ``tokenmix_http_process_cpu_seconds_total``,
    None where the platform has no /proc)."""
    import httpx

    text = httpx.get(f"{url}/metrics").text
    seconds = {phase: _metric(text, f'tokenmix_engine_seconds_total{{phase="{phase}"}}') for phase in ENGINE_PHASES}
    engine, http = _metric(text, "process_cpu_seconds_total"), _metric(text, "tokenmix_http_process_cpu_seconds_total")
    return seconds | {"cpu": None if engine is None or http is None else engine + http}


def serve_tables(records: list[dict]) -> str:
    """Throughput and latency per model and concurrency; prefix reuse; the flood."""
    rows = [
        {
            "model": r["model"],
            "clients": r["concurrency"],
            "tokens_s": r["tokens_per_second"],
            "batched_tokens_s": r["batched_tokens_per_second"],
            "vs_batched": r["tokens_per_second"] / r["batched_tokens_per_second"],
            "vs_one_at_a_time": r["tokens_per_second"] / r["sequential_tokens_per_second"],
            "batched_vs_one_at_a_time": r["batched_tokens_per_second"] / r["sequential_tokens_per_second"],
            **{f"ttft_p{share}_ms": r[f"ttft_p{share}_ms"] for share in PERCENTILES},
            **{f"tpot_p{share}_ms": r[f"tpot_p{share}_ms"] for share in PERCENTILES},
        }
        for r in records
        if r["kind"] == "serve"
    ]
    base = {r["model"]: r["tpot_p50_ms"] for r in rows if r["clients"] == min(row["clients"] for row in rows)} if rows else {}
    for row in rows:
        row["tpot_vs_1"] = row["tpot_p50_ms"] / base[row["model"]] if row["model"] in base else None
    tables = [format_table(rows, list(rows[0]))] if rows else []
    phases = [
        {
            "model": r["model"],
            "clients": r["concurrency"],
            "served_s": r["seconds"],
            "batched_s": r["tokens"] / r["batched_tokens_per_second"],
            **{f"{phase}_s": r[f"engine_{phase}_seconds"] for phase in ENGINE_PHASES},
            "server_cpu_s": r.get("server_cpu_seconds"),
            "clients_cpu_s": r.get("clients_cpu_seconds"),
        }
        for r in records
        if r["kind"] == "serve" and "seconds" in r
    ]
    if phases:
        tables.append(format_table(phases, list(phases[0])))
    for kind, keys in (
        ("serve_prefix", ["model", "prompt_tokens", "first_ttft_ms", "second_ttft_ms", "speedup"]),
        ("serve_flood", ["model", "requests", "completed", "refused_429", "lost", "budget_bytes", "peak_state_bytes"]),
    ):
        chosen = [{key: r[key] for key in keys} for r in records if r["kind"] == kind]
        if chosen:
            tables.append(format_table(chosen, keys))
    return "\n\n".join(tables)


def write_serve_plots(records: list[dict], folder) -> list[Path]:
    """Per model: output tokens per second against concurrency (served, batched in process, one at a
    time), and time per output token (p50, p95)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r["kind"] == "serve"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        return []
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    figure, (rate, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, name in enumerate(models):
        mine = [r for r in rows if r["model"] == name]
        clients = [r["concurrency"] for r in mine]
        color = f"C{index}"
        rate.plot(clients, [r["tokens_per_second"] for r in mine], "o-", color=color, label=f"{name}: served")
        batched = [r["batched_tokens_per_second"] for r in mine]
        rate.plot(clients, batched, "s--", color=color, alpha=0.6, label=f"{name}: generate, batched")
        rate.plot(clients, [r["sequential_tokens_per_second"] for r in mine], ":", color=color, alpha=0.6)
        latency.plot(clients, [r["tpot_p50_ms"] for r in mine], "o-", color=color, label=f"{name} p50")
        latency.plot(clients, [r["tpot_p95_ms"] for r in mine], "^:", color=color, alpha=0.6, label=f"{name} p95")
    titles = ((rate, "output tokens per second (dotted: one at a time)", "tokens/s"), (latency, "time per output token", "ms"))
    for axis, title, unit in titles:
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("concurrent streaming clients")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    path = folder / "serve.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return [path]
