"""``tokenmix serve`` as a user runs it: a real server process on a free local port, driven over HTTP by
the official ``openai`` client, httpx and a headless Chromium; faults included (disconnects, a flood
against a small memory budget, malformed requests, bad keys, SIGTERM while streaming; a dead engine:
test_serve_restart.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason='the server needs its extra: pip install "tokenmix[serve]"')
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai", reason="the server is tested with the official openai client (the dev extra)")

from conftest import FUSED_ON_CPU  # noqa: E402

import tokenmix  # noqa: E402
from tokenmix.runs import open_run  # noqa: E402
from tokenmix.serve.launch import ServerProcess  # noqa: E402

KEY = "test-key"
MAX_PROMPT, MAX_TOKENS = 256, 64
CONTEXT = MAX_PROMPT + MAX_TOKENS  # every state is made for it: generate(..., max_length=CONTEXT) is what a request gets


def serving(run, *flags: str) -> ServerProcess:
    """The run served with the limits these tests expect, one torch thread."""
    return ServerProcess(run, "--threads", "1", "--max-prompt-tokens", str(MAX_PROMPT), "--max-tokens", str(MAX_TOKENS), *flags)


@pytest.fixture(scope="module")
def run(tiny_runs):
    return tiny_runs["lm"]


@pytest.fixture(scope="module")
def served(run):
    server = serving(run, "--api-key", KEY)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def network(run):
    opened = open_run(run)
    return opened.model, opened.tokenizer


def headers(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def alone(network, prompt: str, max_tokens: int, **sampling) -> str:
    """What ``tokenmix.generate`` gives ``prompt`` alone, as text (no stop strings in these requests)."""
    model, tokenizer = network
    ids = tokenmix.generate(model, [tokenizer.encode(prompt)], max_tokens, max_length=CONTEXT, **sampling)[0]
    return tokenizer.decode(ids).decode("utf-8", errors="replace")


def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0)


def test_the_openai_client_completes_streamed_and_not_as_generate_does(served, network):
    openai_client = client(served)
    assert [model.id for model in openai_client.models.list().data] == ["lm"]
    answer = openai_client.completions.create(model="lm", prompt="To be, or", max_tokens=20, temperature=0.9, top_p=0.95, seed=7)
    assert answer.choices[0].text == alone(network, "To be, or", 20, temperature=0.9, top_p=0.95, seed=7)
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 20
    chunks = list(openai_client.completions.create(model="lm", prompt="To be, or", max_tokens=20, temperature=0, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == alone(network, "To be, or", 20, temperature=0)
    assert chunks[-1].choices[0].finish_reason == "length"
    several = openai_client.completions.create(model="lm", prompt="that is", max_tokens=10, n=3, seed=2, logprobs=2)
    for choice in several.choices:
        rows = tokenmix.generate(network[0], [network[1].encode("that is")] * 3, 10, seed=2, max_length=CONTEXT)
        assert choice.text == network[1].decode(rows[choice.index]).decode("utf-8", errors="replace")
        assert len(choice.logprobs.tokens) == 10 and all(len(top) == 2 for top in choice.logprobs.top_logprobs)


def test_a_server_that_decodes_from_static_buffers_answers_as_generate_does(run, network):
    """``--decoding static`` (eager on the CPU, a CUDA graph per batch on CUDA) crosses to the engine's process; with
    ``--kernels fused`` where the fused kernels run on the CPU (the history kernel, in Triton's interpreter: conftest.py;
    the tokens cannot tell which kernel ran: ``test_generate_steps_static_buffers_by_the_fused_kernel_when_told``)."""
    fused = ["--kernels", "fused"] if FUSED_ON_CPU else []
    with serving(run, "--decoding", "static", *fused) as server:
        assert any(line.endswith("batches decode from static buffers") for line in server.lines)
        http = httpx.Client(timeout=120)
        requests = [
            {"model": "lm", "prompt": prompt, "max_tokens": 12, "temperature": 0.8, "seed": 4} for prompt in ("To be", "that is the")
        ]
        answers = [http.post(f"{server.url}/v1/completions", json=request).json() for request in requests]
    for request, answer in zip(requests, answers, strict=True):
        assert answer["choices"][0]["text"] == alone(network, request["prompt"], 12, temperature=0.8, seed=4)


def test_64_concurrent_requests_each_get_what_generate_gives_them_alone(served, network):
    """Different prompt lengths, sampling settings and seeds, half streamed, all at once."""
    text = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer"
    requests = [
        {
            "model": "lm",
            "prompt": text[: 3 + (index * 7) % (len(text) - 3)],
            "max_tokens": 5 + index % 23,
            "temperature": (0.0, 1.0, 0.7, 1.3)[index % 4],
            "top_k": (0, 20)[index % 2],
            "top_p": (1.0, 0.9)[index // 2 % 2],
            "seed": index,
            "stream": index % 2 == 1,
        }
        for index in range(64)
    ]

    def ask(request: dict) -> str:
        with httpx.Client(timeout=120) as http:
            if not request["stream"]:
                response = http.post(f"{served.url}/v1/completions", json=request, headers=headers())
                assert response.status_code == 200, response.text
                return response.json()["choices"][0]["text"]
            with http.stream("POST", f"{served.url}/v1/completions", json=request, headers=headers()) as response:
                events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            return "".join(json.loads(event)["choices"][0]["text"] for event in events[:-1])

    with ThreadPoolExecutor(64) as pool:
        texts = list(pool.map(ask, requests))
    for request, got in zip(requests, texts, strict=True):
        options = {key: request[key] for key in ("temperature", "top_p", "seed")} | {"top_k": request["top_k"] or None}
        assert got == alone(network, request["prompt"], request["max_tokens"], **options), request
    metrics = httpx.get(f"{served.url}/metrics", headers=headers()).text
    assert 'tokenmix_requests_total{outcome="completed"}' in metrics and "tokenmix_time_to_first_token_seconds_count" in metrics
    assert 'tokenmix_engine_seconds_total{phase="decode"}' in metrics and 'tokenmix_engine_seconds_total{phase="prefill"}' in metrics
    assert "process_cpu_seconds_total" in metrics or not sys.platform.startswith("linux")  # the server's CPU time, beside the engine's


MALFORMED = [
    (b"{not json", "JSON"),
    (b"\xff\xfe{}", "UTF-8"),
    (b"[1, 2]", "object"),
    (b"{}", "prompt"),
    (json.dumps({"prompt": ""}).encode(), "prompt"),
    (json.dumps({"prompt": []}).encode(), "prompt"),
    (json.dumps({"prompt": [1, 2, 999999]}).encode(), "prompt"),
    (json.dumps({"prompt": [[1], ["a"]]}).encode(), "prompt"),
    (json.dumps({"prompt": 5}).encode(), "prompt"),
    (json.dumps({"prompt": "x" * (MAX_PROMPT + 1)}).encode(), "prompt"),
    (json.dumps({"prompt": "a", "model": "other"}).encode(), "model"),
    (json.dumps({"prompt": "a", "max_tokens": -1}).encode(), "max_tokens"),
    (json.dumps({"prompt": "a", "max_tokens": 10**12}).encode(), "max_tokens"),
    (json.dumps({"prompt": "a", "max_tokens": "5"}).encode(), "max_tokens"),
    (json.dumps({"prompt": "a", "max_tokens": 2.5}).encode(), "max_tokens"),
    (json.dumps({"prompt": "a", "temperature": -0.1}).encode(), "temperature"),
    (json.dumps({"prompt": "a", "temperature": "hot"}).encode(), "temperature"),
    (b'{"prompt": "a", "temperature": NaN}', "temperature"),
    (b'{"prompt": "a", "temperature": Infinity}', "temperature"),
    (json.dumps({"prompt": "a", "top_p": 0}).encode(), "top_p"),
    (json.dumps({"prompt": "a", "top_p": 1.5}).encode(), "top_p"),
    (json.dumps({"prompt": "a", "top_k": -2}).encode(), "top_k"),
    (json.dumps({"prompt": "a", "top_k": True}).encode(), "top_k"),
    (json.dumps({"prompt": "a", "seed": -1}).encode(), "seed"),
    (json.dumps({"prompt": "a", "seed": 2**80}).encode(), "seed"),
    (json.dumps({"prompt": "a", "n": 0}).encode(), "n"),
    (json.dumps({"prompt": "a", "n": 10**6}).encode(), "n"),
    (json.dumps({"prompt": "a", "stop": ""}).encode(), "stop"),
    (json.dumps({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}).encode(), "stop"),
    (json.dumps({"prompt": "a", "stop": [1]}).encode(), "stop"),
    (json.dumps({"prompt": "a", "stream": "yes"}).encode(), "stream"),
    (json.dumps({"prompt": "a", "stream_options": {"include_usage": 1}}).encode(), "stream_options"),
    (json.dumps({"prompt": "a", "logprobs": 100}).encode(), "logprobs"),
    (json.dumps({"prompt": "a", "echo": True}).encode(), "echo"),
    (json.dumps({"prompt": "a", "best_of": 3}).encode(), "best_of"),
    (json.dumps({"prompt": "a", "temprature": 1}).encode(), "temprature"),
    (b"x" * 2_000_000, "bytes"),
]


@pytest.mark.parametrize("body, named", MALFORMED, ids=[named for _, named in MALFORMED])
def test_a_malformed_request_gets_an_openai_error_naming_the_problem_and_the_server_goes_on(served, body, named):
    response = httpx.post(f"{served.url}/v1/completions", content=body, headers=headers(), timeout=30)
    assert response.status_code in (400, 404, 413), response.text
    error = response.json()["error"]
    assert named in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert httpx.post(f"{served.url}/v1/completions", json={"prompt": "a", "max_tokens": 2}, headers=headers()).status_code == 200


def test_a_wrong_or_missing_key_gets_401_and_health_needs_none(served):
    for given in ({}, headers("wrong"), {"Authorization": KEY}):
        response = httpx.post(f"{served.url}/v1/completions", json={"prompt": "a"}, headers=given)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{served.url}/v1/models").status_code == 401
    assert httpx.get(f"{served.url}/metrics").status_code == 401
    health = httpx.get(f"{served.url}/health").json()
    assert health["status"] == "ok" and health["engine"]["restarts"] == 0 and health["engine"]["last_exit_code"] is None
    assert httpx.get(f"{served.url}/v1/nothing", headers=headers()).json()["error"]["type"] == "not_found_error"


def metric(served, name: str) -> float:
    text = httpx.get(f"{served.url}/metrics", headers=headers()).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_client_that_disconnects_mid_stream_frees_its_sequence(served):
    cancelled = metric(served, 'tokenmix_requests_total{outcome="cancelled"}')
    request = {"prompt": "To be", "max_tokens": MAX_TOKENS, "stream": True, "temperature": 0}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{served.url}/v1/completions", json=request, headers=headers()) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # the first token came; then the client leaves
    for _ in range(200):
        if metric(served, 'tokenmix_requests_total{outcome="cancelled"}') == cancelled + 1:
            break
        threading.Event().wait(0.05)
    assert metric(served, 'tokenmix_requests_total{outcome="cancelled"}') == cancelled + 1
    assert httpx.post(f"{served.url}/v1/completions", json={"prompt": "a", "max_tokens": 3}, headers=headers()).status_code == 200


# bytes of state: 16 of the flood's short rows (24.6 KB each; its --max-batch 64 would hold 1.6 MB, so the budget is
# what binds), or one LONG row (393 KB at 1024 positions for the tiny run)
BUDGET = 400_000
LONG = 1000  # tokens: the stream is still running when SIGTERM comes


@pytest.fixture(scope="module")
def small_memory_server(run):
    """The flood's server (a state budget of BUDGET bytes, completions of up to LONG tokens), shared with the SIGTERM
    test, which ends it: a call after that (or after any exit) starts a new one, so either test may also run alone."""
    servers: list[ServerProcess] = []

    def current() -> ServerProcess:
        if not servers or servers[-1].process.poll() is not None:
            servers.append(serving(run, "--max-state-memory", str(BUDGET), "--max-batch", "64", "--max-tokens", str(LONG)))
        return servers[-1]

    yield current
    for server in servers:
        server.stop()


@pytest.mark.slow
def test_500_requests_at_once_against_a_small_memory_each_complete_or_get_429(small_memory_server):
    """Nothing is lost or hangs: every request gets its whole completion or a 429 with Retry-After, and
    the states never hold more than the budget."""
    server = small_memory_server()

    async def flood():
        limits = httpx.Limits(max_connections=500)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            requests = [
                {"prompt": "To be" * (1 + index % 5), "max_tokens": 8 + index % 9, "stream": index % 2 == 0} for index in range(500)
            ]
            return await asyncio.gather(*(http.post(f"{server.url}/v1/completions", json=request) for request in requests)), requests

    responses, requests = asyncio.run(flood())
    statuses = [response.status_code for response in responses]
    assert set(statuses) <= {200, 429} and 200 in statuses and 429 in statuses
    for response, request in zip(responses, requests, strict=True):
        if response.status_code == 429:
            assert response.headers["retry-after"] and "full" in response.json()["error"]["message"]
        elif request["stream"]:
            assert response.text.rstrip().endswith("data: [DONE]")
        else:
            assert response.json()["usage"]["completion_tokens"] == request["max_tokens"]
    assert 0 < metric(server, "tokenmix_state_bytes_peak") <= BUDGET
    assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200


@pytest.mark.slow
def test_sigterm_lets_running_requests_finish_refuses_new_ones_and_exits(small_memory_server):
    """A stream running when SIGTERM comes gets all its tokens, a new request gets 503, and the server exits with 0."""
    server = small_memory_server()
    request = {"prompt": "To be", "max_tokens": LONG, "stream": True, "temperature": 0}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/v1/completions", json=request) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        server.process.send_signal(signal.SIGTERM)
        for _ in range(100):
            if httpx.get(f"{server.url}/health").status_code == 503:
                break
            threading.Event().wait(0.02)
        refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": "a"})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        rest = [first, *(line for line in lines if line.startswith("data: "))]
    assert rest[-1] == "data: [DONE]" and len(rest) == LONG + 2  # every token, the finish, [DONE]
    assert server.process.wait(30) == 0


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_the_page_streams_what_the_api_gives_for_the_same_seed(served, network):
    """Debian's Chromium, headless, through Playwright: type a prompt, press Generate, read the text."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the page is tested with playwright (the dev extra)")
    if not os.path.exists(CHROMIUM):
        assert not os.environ.get("TOKENMIX_REQUIRE_BROWSER"), f"CI requires the browser test: {CHROMIUM} is missing"
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(served.url)
        page.fill("#prompt", "To be, or")
        page.fill("#max_tokens", "30")
        page.fill("#seed", "11")
        page.fill("#api_key", KEY)
        page.click("#generate")
        page.wait_for_function("document.getElementById('status').textContent.includes('(done)')", timeout=60_000)
        shown = page.inner_text("#sample")
        status = page.inner_text("#status")
        browser.close()
    request = {"prompt": "To be, or", "max_tokens": 30, "seed": 11, "temperature": 0.8, "top_k": 40, "top_p": 1}
    api = httpx.post(f"{served.url}/v1/completions", json=request, headers=headers()).json()["choices"][0]["text"]
    assert shown == api == alone(network, "To be, or", 30, temperature=0.8, top_k=40, seed=11)
    assert "30 tokens" in status and "tokens/s" in status
