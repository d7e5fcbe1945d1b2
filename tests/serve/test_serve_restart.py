"""The server outlives its engine: a real ``tokenmix serve`` whose engine process is killed (SIGKILL)
fails the requests it was running, restarts the engine and serves again; killed three times within a
minute (once, with ``--engine-restarts 0``), the server exits with status 1 and one line giving the
engine's exit codes. Each test has a server of its own (it ends it)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

pytest.importorskip("fastapi", reason='the server needs its extra: pip install "tokenmix[serve]"')
httpx = pytest.importorskip("httpx")

from conftest import usage_error  # noqa: E402
from test_serve import metric, serving  # noqa: E402

from tokenmix.serve.remote import EngineProcess  # noqa: E402

LONG = 3000  # tokens: a request still running when its engine is killed


def health(server) -> dict:
    return httpx.get(f"{server.url}/health", timeout=30).json()


def complete(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)


def kill_engine(server, killed: set[int]) -> int:
    """SIGKILL the server's engine process (the first one /health names that is not in ``killed``); its pid."""
    end = time.monotonic() + 120
    while (pid := health(server)["engine"]["pid"]) in killed and time.monotonic() < end:
        time.sleep(0.02)
    assert pid not in killed, "no new engine process was started"
    os.kill(pid, signal.SIGKILL)
    killed.add(pid)
    return pid


def served_again(server, since: float) -> float:
    """Seconds from ``since`` (the kill) until a request is served, asking every 50 ms; while the engine
    restarts, each request gets 503 ``engine_restarting`` with Retry-After."""
    while time.monotonic() < since + 120:
        response = complete(server, prompt="To be", max_tokens=3)
        if response.status_code == 200:
            assert response.json()["usage"]["completion_tokens"] == 3
            return time.monotonic() - since
        assert response.status_code == 503 and response.json()["error"]["code"] == "engine_restarting", response.text
        assert int(response.headers["retry-after"]) >= 1
        time.sleep(0.05)
    raise AssertionError("no request was served within 120 s of the engine's death")


def stopped_with_one_line(server, deaths: int) -> None:
    """The server exits with status 1, its last line its only error: the engine died ``deaths`` times within a minute."""
    status = server.process.wait(60)
    server.stop()
    errors = [line for line in server.lines if "error" in line]
    assert status == 1 and errors == [server.lines[-1]], server.lines
    died = "once" if deaths == 1 else f"{deaths} times"
    assert errors[0] == (
        f"tokenmix serve: error: the engine process died {died} within 60 s "
        f"(exit codes: {', '.join(['-9 (SIGKILL)'] * deaths)}; restarts allowed a minute: {deaths - 1})"
    )


def test_a_killed_engine_fails_its_requests_is_restarted_within_seconds_and_a_third_death_in_a_minute_stops_it(tiny_runs):
    """By default two restarts a minute: after the first death is served again, two more deaths stop the server
    (one server for both: the engine is back within seconds, well inside the minute)."""
    server = serving(tiny_runs["lm"], "--max-tokens", str(LONG))
    killed: set[int] = set()
    try:
        before = health(server)
        assert before["status"] == "ok" and before["engine"]["restarts"] == 0 and before["engine"]["last_exit_code"] is None
        answers = []
        waiting = threading.Thread(target=lambda: answers.append(complete(server, prompt="To", max_tokens=LONG)))
        waiting.start()
        request = {"prompt": "To be", "max_tokens": LONG, "stream": True, "temperature": 0}
        with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/v1/completions", json=request) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            end = time.monotonic() + 60
            while metric(server, "tokenmix_batch_size") < 2 and time.monotonic() < end:  # both requests are decoding
                time.sleep(0.02)
            assert metric(server, "tokenmix_batch_size") == 2
            kill_engine(server, killed)
            death = time.monotonic()
            last = [line for line in lines if line.startswith("data: ")][-1]
        error = json.loads(last[6:])["error"]
        assert error["code"] == "engine_stopped" and "exit code -9 (SIGKILL)" in error["message"] and "restarted" in error["message"]
        waiting.join(60)
        assert answers[0].status_code == 503 and answers[0].json()["error"]["code"] == "engine_stopped", answers[0].text
        seconds = served_again(server, death)
        print(f"\nengine killed -> first request served again after {seconds:.2f} s")
        after = health(server)
        assert after["status"] == "ok" and after["engine"]["restarts"] == 1 and after["engine"]["last_exit_code"] == -9
        assert after["engine"]["pid"] != before["engine"]["pid"]
        for _ in range(2):  # the second may die while it starts: that is a death too
            kill_engine(server, killed)
        stopped_with_one_line(server, 3)
    finally:
        server.stop()
    assert any("restarting it (restart 1, at most 2 a minute)" in line for line in server.lines), server.lines


def test_with_no_restarts_the_first_death_of_the_engine_stops_the_server_with_one_line(tiny_runs):
    """--engine-restarts 0: vLLM's way."""
    server = serving(tiny_runs["lm"], "--engine-restarts", "0")
    try:
        kill_engine(server, set())
        stopped_with_one_line(server, 1)
    finally:
        server.stop()


def test_restarts_must_be_a_count(tiny_runs, capsys):
    for bad in ("-1", "1.5", "x"):
        error = usage_error(["serve", str(tiny_runs["lm"]), "--engine-restarts", bad], capsys)
        assert "--engine-restarts: must be an integer >= 0" in error
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="restarts must be an integer >= 0"):
            EngineProcess({}, restarts=bad)
