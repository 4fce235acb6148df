"""The rest of the request path a stranger can lean on: huge numbers of inputs in a body
(the error stays short), a long string among numbers (no fixed-width string array of
elements x longest string), request heads over the limit (431; httptools has none of its
own), and .npz/.npy bodies the server refuses from their headers. Each is answered with a
4xx JSON error and the server answers a good request afterwards."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.support.serving import (
    GOOD,
    NPY,
    NPZ,
    X,
    assert_good_answer,
    mlp,
    npy_bytes,
    npz_bytes,
    read_response,
)
from tfrt_py.serving import ServerThread, create_app
from tfrt_py.serving.limits import MAX_HEAD_BYTES


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with ServerThread(create_app({"mlp": mlp()})) as base:  # the default 16 MiB body limit
        yield base


@pytest.fixture
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=120) as c:
        yield c


def _refused(r: httpx.Response, status: int, *needles: str) -> str:
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"] == "application/json"
    error: str = r.json()["error"]
    for needle in needles:
        assert needle in error, error[:2000]
    return error


def test_a_hundred_thousand_unknown_inputs_give_a_short_error(client: httpx.Client) -> None:
    inputs = {f"input_{i}": 0 for i in range(100_000)}
    inputs["x"] = X.tolist()
    r = client.post("/v1/models/mlp:predict", json={"inputs": inputs})
    error = _refused(r, 400, "unknown input", "input_0", "more")
    assert len(error) < 2000
    assert_good_answer(client.post("/v1/models/mlp:predict", json=GOOD))


def test_an_npz_of_ten_thousand_members_gives_a_short_error(client: httpx.Client) -> None:
    body = npz_bytes(x=X, **{f"k{i}": np.zeros(1, np.float32) for i in range(10_000)})
    r = client.post("/v1/models/mlp:predict", content=body, headers=NPZ)
    error = _refused(r, 400, "10001 members")
    assert len(error) < 2000
    assert_good_answer(client.post("/v1/models/mlp:predict", json=GOOD))


def test_a_long_string_among_numbers_is_refused_without_allocating(
    client: httpx.Client,
) -> None:
    # As one NumPy array: a million strings of width four million, 16 TB.
    row = ["b"] * 1_000_000 + ["a" * 4_000_000]
    body = json.dumps({"inputs": {"x": [row]}}).encode()
    assert len(body) < 16 << 20
    r = client.post(
        "/v1/models/mlp:predict", content=body, headers={"content-type": "application/json"}
    )
    _refused(r, 400, "'x'", "strings")
    assert_good_answer(client.post("/v1/models/mlp:predict", json=GOOD))


def test_a_request_head_over_the_limit_is_431(url: str, client: httpx.Client) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        s.sendall(b"a" * (MAX_HEAD_BYTES + 1024) + b"\r\n\r\n")
        reply = read_response(s)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]
    body = reply.partition(b"\r\n\r\n")[2]
    assert str(MAX_HEAD_BYTES).encode() in body
    assert_good_answer(client.post("/v1/models/mlp:predict", json=GOOD))


NPY_BODIES = [
    pytest.param(npy_bytes(np.array([{}], dtype=object)), 400, "pickles", id="object"),
    pytest.param(npy_bytes(X.astype(np.int64)), 400, "int64", id="unsafe-dtype"),
    pytest.param(npy_bytes(X)[:-10], 400, "truncated", id="truncated"),
    pytest.param(npy_bytes(X) + b"\0" * 16, 400, "more data", id="trailing-data"),
    pytest.param(b"\x93NUMPY\x03\x00" + bytes(64), 400, "version", id="version-3"),
]


@pytest.mark.parametrize(("body", "status", "needle"), NPY_BODIES)
def test_npy_bodies_refused_from_the_header(
    client: httpx.Client, body: bytes, status: int, needle: str
) -> None:
    r = client.post("/v1/models/mlp:predict", content=body, headers=NPY)
    _refused(r, status, needle)
    assert_good_answer(client.post("/v1/models/mlp:predict", json=GOOD))


def test_an_npy_in_fortran_order_or_big_endian_is_answered(client: httpx.Client) -> None:
    for arr in (np.asfortranarray(X), X.astype(">f4")):
        r = client.post("/v1/models/mlp:predict", content=npy_bytes(arr), headers=NPY)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(
            r.json()["outputs"]["probs"], mlp().run({"x": X})["probs"], rtol=1e-6, atol=1e-7
        )
