"""Every request has a deadline (``timeout``, 30 s by default): a model that does not
answer in time is a 504 naming the model, a body that does not arrive in time a 408, and
`tfrt-py serve` stops on SIGTERM even while a request is stuck in a model.

The model: y = x + n by a Loop whose trip count ``n`` is a feed, so a client chooses how
long a call runs (2**62 iterations: for good). Stopping such a call is the runtime's job
(``model.run(feeds, timeout=s)`` raising ``DeadlineExceeded``); the server passes the
request's remaining time to it and answers 504 when it passes.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

import tfrt_py
from tests.support.serving import (
    GOOD,
    assert_good_answer,
    loop_model,
    mlp,
    read_response,
    serve_process,
    wait_ready,
)
from tfrt_py.serving import ModelServer, ServerThread, create_app
from tfrt_py.serving.limits import DEFAULT_TIMEOUT_S

TIMEOUT = 0.5  # the test server's per-request deadline, seconds
FOREVER = 2**62
SLOW = 2_000_000  # iterations: seconds of work, far past TIMEOUT


def _loop_body(n: int) -> dict[str, object]:
    return {"inputs": {"n": n, "x": [0.0, 0.0, 0.0, 0.0]}}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = create_app({"loop": tfrt_py.load(loop_model()), "mlp": mlp()}, timeout=TIMEOUT)
    with ServerThread(app) as base:
        yield base


@pytest.fixture
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=120) as c:
        yield c


def test_the_deadline_is_on_by_default() -> None:
    server = ModelServer({"mlp": mlp()})
    try:
        assert server.timeout == DEFAULT_TIMEOUT_S == 30.0
    finally:
        server.close()


def test_a_runaway_model_is_504_naming_the_model(client: httpx.Client) -> None:
    r = client.post("/v1/models/loop:predict", json=_loop_body(FOREVER))
    assert r.status_code == 504, r.text
    assert "'loop'" in r.json()["error"] and "deadline" in r.json()["error"]
    r = client.post("/v1/models/loop:predict", json=_loop_body(3))
    assert r.status_code == 200, r.text  # the model's thread is free again
    assert r.json()["outputs"]["y"] == [3.0] * 4


def test_a_slow_model_is_504_and_the_server_keeps_serving(client: httpx.Client) -> None:
    r = client.post("/v1/models/loop:predict", json=_loop_body(SLOW))
    assert r.status_code == 504, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert "'loop'" in error and f"deadline of {TIMEOUT:g} s" in error
    assert client.get("/healthz").status_code == 200
    assert_good_answer(client.post("/v1/models/mlp:predict", json=GOOD))


def test_a_body_that_does_not_arrive_in_time_is_408(url: str, client: httpx.Client) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(
            b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            b'{"inputs": '  # ... and the other 989 bytes never come
        )
        reply = read_response(s)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"did not arrive within the deadline" in reply
    assert_good_answer(client.post("/v1/models/mlp:predict", json=GOOD))


# -- `tfrt-py serve` ------------------------------------------------------------------------


def test_serve_has_a_timeout_option() -> None:
    from click.testing import CliRunner

    from tfrt_py.cli import main

    out = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--timeout" in out and "--drain-timeout" in out and "--max-decoded-bytes" in out


def _wait_in_flight(c: httpx.Client) -> None:
    """Until the server reports the request in flight (or cannot answer: busy with it)."""
    for _ in range(600):
        try:
            r = c.get("/v1/models/loop", timeout=1)
        except httpx.TimeoutException:
            return
        if r.json().get("in_flight"):
            return
        time.sleep(0.05)
    raise AssertionError("the stuck request never reached the model")


def test_serve_stops_on_sigterm_while_a_request_is_stuck(tmp_path: Path) -> None:
    model = tmp_path / "loop.onnx"
    onnx.save(loop_model(), model)
    log = tmp_path / "serve.log"
    args = [str(model), "--timeout", "3600", "--drain-timeout", "1"]  # no deadline help
    with serve_process(args, log) as (proc, url):
        outcome: list[object] = []

        def stuck() -> None:
            try:
                with httpx.Client(base_url=url, timeout=120) as c:
                    outcome.append(c.post("/v1/models/loop:predict", json=_loop_body(FOREVER)))
            except httpx.TransportError as e:
                outcome.append(e)

        with httpx.Client(base_url=url, timeout=30) as c:
            wait_ready(c)
            thread = threading.Thread(target=stuck, daemon=True)
            thread.start()
            _wait_in_flight(c)
        proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None  # hangs: serve_process kills it
        # drained (1 s), the request cancelled, the model's thread given up on: a clean
        # exit by the signal, not the watchdog's forced one (128 + 15)
        assert code == -signal.SIGTERM, (code, log.read_text())
        assert "model call(s) still running" in log.read_text()
        assert "tfrt-py serve: stopped" in log.read_text()
        thread.join(60)
        assert outcome, "the stuck request got no answer and no error"
        assert not isinstance(outcome[0], httpx.Response) or outcome[0].status_code >= 500


def test_loop_model_is_well_formed() -> None:
    onnx.checker.check_model(loop_model())
    y = tfrt_py.load(loop_model()).run({"n": np.array(5), "x": np.zeros(4, np.float32)})["y"]
    np.testing.assert_array_equal(y, [5.0] * 4)
