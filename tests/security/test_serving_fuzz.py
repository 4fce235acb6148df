"""Fuzzing the request bodies of a real server (uvicorn on loopback, httpx): JSON values of
every shape and type, .npy headers and data, .npz archives, valid ones and mutated ones
(bit flips, byte changes, truncations, splices). Every answer is a 2xx, or a 4xx whose
body is JSON ``{"error": message}`` -- never a 5xx, never a dropped connection -- and the
server answers a good request correctly afterwards, on the same connection.

Hypothesis runs derandomized (the same examples in CI as locally), with moderate example
counts: the machine is shared.
"""

from __future__ import annotations

import io
import json
import random
import warnings
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfrt_py
from tests.support.serving import (
    GOOD,
    NPY,
    NPZ,
    X,
    assert_good_answer,
    client_port,
    mlp,
    npy_header,
    rowsum_model,
)
from tfrt_py.examples import make_models
from tfrt_py.serving import ServerThread, create_app

FUZZ = settings(
    derandomize=True,
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MODELS = ("mlp", "ads", "rowsum", "ints")
DTYPES = ["<f4", "<f8", ">f4", "<i1", "<i8", "<u2", "|b1", "<U3", "|S2", "<c8", "|O", "<M8[s]"]


def ints_model() -> tfrt_py.Model:
    from tfrt_py.ir import GraphBuilder

    b = GraphBuilder("ints", opset=17)
    x = b.input("x", np.int8, ("N", 3))
    b.output(b.op("Add", x, b.const(np.ones((1, 3), np.int8))), "y")
    return tfrt_py.load(b.build())


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    models = {
        "mlp": mlp(),
        "ads": tfrt_py.load(make_models.ads_normalize()),
        "rowsum": tfrt_py.load(rowsum_model()),
        "ints": ints_model(),
    }
    app = create_app(models, max_body_bytes=1 << 20)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=120) as c:
        yield c


def check(c: httpx.Client, model: str, body: bytes, ctype: str) -> None:
    """The server's answer to ``body`` is a 2xx or a JSON 4xx, and it then answers a good
    request on the same connection."""
    r = c.post(f"/v1/models/{model}:predict", content=body, headers={"content-type": ctype})
    what = f"{ctype} body {body[:120]!r}... ({len(body)} bytes) -> {r.status_code} {r.text[:300]}"
    assert r.status_code < 500, what
    if r.status_code >= 400:
        assert r.headers["content-type"] == "application/json", what
        assert isinstance(r.json()["error"], str) and r.json()["error"], what
    port = client_port(r)
    good = c.post("/v1/models/mlp:predict", json=GOOD)
    assert_good_answer(good)
    assert client_port(good) == port, f"connection dropped after: {what}"


def mutate(data: bytes, rnd: random.Random) -> bytes:
    """One random mutation of ``data``: a bit flip, a byte, a run of bytes, a truncation,
    or a splice of two parts."""
    if not data:
        return bytes([rnd.randrange(256)])
    b = bytearray(data)
    p = rnd.randrange(len(b))
    kind = rnd.choice(("flip", "byte", "run", "cut", "splice"))
    if kind == "flip":
        b[p] ^= 1 << rnd.randrange(8)
    elif kind == "byte":
        b[p] = rnd.randrange(256)
    elif kind == "run":
        b[p : p + 8] = bytes(rnd.randrange(256) for _ in range(8))
    elif kind == "cut":
        del b[p:]
    else:
        q = rnd.randrange(len(b))
        b = b[:p] + b[q:]
    return bytes(b)


# -- JSON -------------------------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=40,
)


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    """Rectangular nested lists (sometimes with one odd leaf): what a client should send,
    and near misses."""
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=4))
    leaf = draw(SCALARS)
    arr = np.full(shape, 0.5).tolist() if shape else 0.5
    odd_leaf = draw(st.booleans()) if shape else False
    if odd_leaf and np.prod(shape) > 0:
        node: Any = arr
        for _ in shape[:-1]:
            node = node[0]
        node[0] = leaf
    return arr


@FUZZ
@given(
    model=st.sampled_from(MODELS),
    names=st.lists(st.sampled_from(["x", "f0", "f1", "y", "", "inputs"]), max_size=3),
    values=st.lists(VALUES | tensors(), min_size=3, max_size=3),
    wrap=st.sampled_from(["inputs", "bare", "extra"]),
)
def test_json_bodies(
    client: httpx.Client, model: str, names: list[str], values: list[Any], wrap: str
) -> None:
    inputs = dict(zip(names, values))
    doc: Any = {"inputs": inputs} if wrap != "bare" else inputs
    if wrap == "extra":
        doc["outputs"] = values[0]
    check(client, model, json.dumps(doc).encode(), "application/json")


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(MODELS))
def test_mutated_json_bodies(client: httpx.Client, seed: int, model: str) -> None:
    rnd = random.Random(seed)
    body = json.dumps(GOOD if model == "mlp" else {"inputs": {"x": [[1, 2, 3]]}}).encode()
    for _ in range(rnd.randint(1, 4)):
        body = mutate(body, rnd)
    check(client, model, body, "application/json")


# -- .npy / .npz -------------------------------------------------------------------------------


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    if draw(st.booleans()):
        shape = (1, 64)
    if dtype.kind == "O":
        return np.full(shape, None, dtype=object)
    return np.zeros(shape, dtype)


@FUZZ
@given(
    arr=arrays(),
    model=st.sampled_from(MODELS),
    seed=st.integers(0, 2**32 - 1),
    mutations=st.integers(0, 3),
    fortran=st.booleans(),
)
def test_npy_bodies(
    client: httpx.Client, arr: np.ndarray, model: str, seed: int, mutations: int, fortran: bool
) -> None:
    rnd = random.Random(seed)
    body = _npy(np.asfortranarray(arr) if fortran else arr)
    for _ in range(mutations):
        body = mutate(body, rnd)
    check(client, model, body, NPY["content-type"])


@FUZZ
@given(
    shape=st.lists(st.integers(-3, 2**62), max_size=4).map(tuple),
    descr=st.sampled_from([*DTYPES, "<U1000000000", "V8", "<f4,<i4", "bogus"]),
    data=st.binary(max_size=300),
)
def test_npy_headers(client: httpx.Client, shape: tuple[int, ...], descr: str, data: bytes) -> None:
    try:
        header = npy_header(shape, descr)
    except (ValueError, TypeError):  # numpy will not even write it: write it by hand
        d = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
        header = b"\x93NUMPY\x01\x00" + len(d).to_bytes(2, "little") + d.encode()
    check(client, "mlp", header + data, NPY["content-type"])


@FUZZ
@given(
    members=st.lists(
        st.tuples(st.sampled_from(["x", "f0", "f17", "y", "x.npy", "../x"]), arrays()),
        max_size=4,
    ),
    model=st.sampled_from(MODELS),
    compressed=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    mutations=st.integers(0, 3),
)
def test_npz_bodies(
    client: httpx.Client,
    members: list[tuple[str, np.ndarray]],
    model: str,
    compressed: bool,
    seed: int,
    mutations: int,
) -> None:
    rnd = random.Random(seed)
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", method) as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # duplicate names: wanted here
        for name, arr in members:
            zf.writestr(name if name.endswith(".npy") else name + ".npy", _npy(arr))
    body = buf.getvalue()
    for _ in range(mutations):
        body = mutate(body, rnd)
    check(client, model, body, NPZ["content-type"])


def test_the_fuzzed_models_answer(client: httpx.Client) -> None:
    assert_good_answer(client.post("/v1/models/mlp:predict", json=GOOD))
    r = client.post("/v1/models/rowsum:predict", json={"inputs": {"x": X.tolist()}})
    assert r.status_code == 200
    np.testing.assert_allclose(r.json()["outputs"]["y"], X.sum(1, keepdims=True), rtol=1e-5)
