"""Bodies that used to be answered 500 (and the connection reset after it) are 4xx with a
JSON message naming the problem: an .npy header claiming a huge shape, a truncated .npz,
JSON nested 100k deep, a JSON integer with 5000 digits. Every error -- a 500 from a bug
included -- is an answered response, and the same keep-alive connection then gets a
correct answer (the client-side port shows it is the same connection)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import tfrt_py
from tests.support.serving import (
    GOOD,
    X,
    assert_good_answer,
    client_port,
    mlp,
    npy_header,
    npz_bytes,
)
from tfrt_py.serving import ServerThread, create_app


class BuggyModel(tfrt_py.Model):
    """mlp_small, except that an input whose first value is 42 makes it raise a plain
    KeyError: a bug, not a model error (stands in for any bug on the request path)."""

    async def run_async(self, feeds: Any, **kw: Any) -> dict[str, np.ndarray]:
        if float(np.asarray(feeds["x"]).flat[0]) == 42.0:
            raise KeyError("a bug")
        result: dict[str, np.ndarray] = await super().run_async(feeds, **kw)
        return result


def buggy_mlp() -> tfrt_py.Model:
    model = copy.copy(mlp())
    model.__class__ = BuggyModel
    return model


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = create_app({"mlp": mlp(), "buggy": buggy_mlp()}, max_body_bytes=1 << 20)
    with ServerThread(app) as base:
        yield base


@pytest.fixture
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def _truncated_npz() -> bytes:
    whole = npz_bytes(x=X)
    return whole[: len(whole) // 2]


BAD_BODIES = [
    pytest.param(
        npy_header((1 << 40, 64)) + bytes(256),
        "application/x-npy",
        ["1099511627776", "declares"],
        id="npy-huge-shape",
    ),
    pytest.param(_truncated_npz(), "application/x-npz", [".npz"], id="npz-truncated"),
    pytest.param(
        b'{"inputs": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
        "application/json",
        ["nested too deeply"],
        id="json-nested-100k",
    ),
    pytest.param(
        b'{"inputs": {"x": [[' + b"7" * 5000 + b"]]}}",
        "application/json",
        ["integer", "5000 digits"],
        id="json-int-5000-digits",
    ),
]


@pytest.mark.parametrize(("body", "ctype", "needles"), BAD_BODIES)
def test_hostile_body_is_4xx_and_the_connection_stays_usable(
    client: httpx.Client, body: bytes, ctype: str, needles: list[str]
) -> None:
    r = client.post("/v1/models/mlp:predict", content=body, headers={"content-type": ctype})
    assert 400 <= r.status_code < 500, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    for needle in needles:
        assert needle in error, error
    port = client_port(r)
    good = client.post("/v1/models/mlp:predict", json=GOOD)
    assert_good_answer(good)
    assert client_port(good) == port, "the server closed the connection after the error"


def test_a_500_is_answered_and_the_connection_stays_usable(client: httpx.Client) -> None:
    bad = {"inputs": {"x": np.full((1, 64), 42.0).tolist()}}
    r = client.post("/v1/models/buggy:predict", json=bad)
    assert r.status_code == 500, r.text
    assert "internal error" in r.json()["error"]
    port = client_port(r)
    for model in ("buggy", "mlp"):
        good = client.post(f"/v1/models/{model}:predict", json=GOOD)
        assert_good_answer(good)
        assert client_port(good) == port, "the server closed the connection after the 500"
