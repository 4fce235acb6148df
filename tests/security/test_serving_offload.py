"""A legal 12 MB JSON body is decoded off the event loop, so the loop keeps running while
it is parsed. No timing: a ticker task on the server's own loop looks, at each tick, for
a thread that is inside ``codec.parse_json`` right then (``sys._current_frames``). Parsing
on the loop's thread makes that impossible (the ticker cannot run while the loop's thread
parses); parsing on a decode thread lets the ticker see it many times. And /healthz on
another connection is answered meanwhile."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from types import FrameType

import httpx
import numpy as np
import pytest

import tfrt_py
from tests.support.serving import rowsum_model
from tfrt_py.serving import ServerThread, create_app

ROWS = 9000  # x float32[9000, 64] as JSON: ~12 MB


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    app = create_app({"rowsum": tfrt_py.load(rowsum_model())}, batching="off")
    st = ServerThread(app)
    st.start()
    try:
        yield st
    finally:
        st.stop()


def _parsing(frame: FrameType | None) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == "parse_json" and code.co_filename.endswith("codec.py"):
            return True
        frame = frame.f_back
    return False


async def _ticker(stop: threading.Event, seen: list[int]) -> None:
    """Runs on the server's loop: counts the ticks at which another thread parses JSON."""
    me = threading.get_ident()
    while not stop.is_set():
        frames = sys._current_frames()
        if any(_parsing(f) for tid, f in frames.items() if tid != me):
            seen[0] += 1
        await asyncio.sleep(0.001)


def test_the_loop_runs_while_a_big_json_body_is_decoded(server: ServerThread) -> None:
    x = np.random.default_rng(3).standard_normal((ROWS, 64)).astype(np.float32)
    body = json.dumps({"inputs": {"x": x.tolist()}}).encode()
    assert 10e6 < len(body) < 16 << 20  # legal: under the default 16 MiB limit
    loop = server.server.servers[0].get_loop()
    stop, seen = threading.Event(), [0]
    ticker = asyncio.run_coroutine_threadsafe(_ticker(stop, seen), loop)
    done = threading.Event()
    healthz = 0
    try:
        with httpx.Client(base_url=server.url, timeout=120) as big:
            result: list[httpx.Response] = []
            thread = threading.Thread(target=_post, args=(big, body, result, done))
            thread.start()
            with httpx.Client(base_url=server.url, timeout=120) as c:
                while not done.is_set():
                    assert c.get("/healthz").status_code == 200
                    healthz += 1
            thread.join(120)
    finally:
        stop.set()
        ticker.result(30)
    r = result[0]
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(
        np.asarray(r.json()["outputs"]["y"])[:, 0], x.sum(axis=1), rtol=1e-4, atol=1e-3
    )
    assert seen[0] >= 3, f"the loop ran {seen[0]} times while the body was parsed"
    assert healthz >= 1


def _post(
    c: httpx.Client, body: bytes, result: list[httpx.Response], done: threading.Event
) -> None:
    try:
        result.append(
            c.post(
                "/v1/models/rowsum:predict",
                content=body,
                headers={"content-type": "application/json"},
            )
        )
    finally:
        done.set()
