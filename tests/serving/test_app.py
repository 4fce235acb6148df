"""tfrt_py.serving over real HTTP: uvicorn on 127.0.0.1 (a thread), httpx clients.

Correct answers (JSON, .npy, .npz), the model list, health and readiness; bad input of
every kind is a 4xx whose message names the problem, and the server answers correctly
afterwards; micro-batching gives the same answers as running each request alone, and one
request's failure stays its own.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import tfrt_py
from tests.support.serving import read_response
from tfrt_py.examples import make_models
from tfrt_py.ir import GraphBuilder
from tfrt_py.serving import MicroBatcher, ModelConfig, ServerThread, create_app

WAIT_FOR_FULL = 10_000_000  # µs: batches in these tests start when full, never on a timer


def wide_mlp() -> tfrt_py.Model:
    """x[N,128] -> 512 -> 512 -> 8: 0.66 MFLOP per row, so the cost model batches it."""
    rng = np.random.default_rng(11)
    b = GraphBuilder("wide", opset=17)
    h = b.input("x", np.float32, ("N", 128))
    for i, (n_in, n_out) in enumerate([(128, 512), (512, 512), (512, 8)]):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        h = b.op("MatMul", h, b.const(w))
        if i < 2:
            h = b.op("Relu", h)
    b.output(h, "y")
    return tfrt_py.load(b.build())


def int_model() -> tfrt_py.Model:
    b = GraphBuilder("ints", opset=17)
    x = b.input("x", np.int8, ("N", 3))
    b.output(b.op("Add", x, b.const(np.ones((1, 3), np.int8))), "y")
    return tfrt_py.load(b.build())


def pick_model() -> tfrt_py.Model:
    """y[n] = x[n, idx[n]]: an index out of range fails the call (not the load)."""
    b = GraphBuilder("pick", opset=17)
    x = b.input("x", np.float32, ("N", 4))
    idx = b.input("idx", np.int64, ("N", 1))
    b.output(b.op("GatherElements", x, idx, axis=1), "y")
    return tfrt_py.load(b.build())


MODELS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    MODELS.update(mlp=tfrt_py.load(make_models.mlp_small()), wide=wide_mlp(), ints=int_model())
    MODELS.update(ads=tfrt_py.load(make_models.ads_normalize()), pick=pick_model())
    app = create_app(
        {
            "mlp": MODELS["mlp"],
            "wide": ModelConfig(MODELS["wide"], max_batch=4, max_wait_us=WAIT_FOR_FULL),
            "ints": MODELS["ints"],
            "ads": MODELS["ads"],
            "pick": ModelConfig(
                MODELS["pick"], batching="on", max_batch=4, max_wait_us=WAIT_FOR_FULL
            ),
        },
        max_body_bytes=64 * 1024,
    )
    with ServerThread(app) as base:
        yield base


@pytest.fixture
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=30) as c:
        yield c


X = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)


def assert_serving(c: httpx.Client) -> None:
    """The server still gives the right answer."""
    r = c.post("/v1/models/mlp:predict", json={"inputs": {"x": X.tolist()}})
    assert r.status_code == 200, r.text
    want = MODELS["mlp"].run({"x": X})["probs"]
    np.testing.assert_allclose(r.json()["outputs"]["probs"], want, rtol=1e-6, atol=1e-7)


# -- answers --------------------------------------------------------------------------------


def test_json_predict_converts_floats_explicitly(client: httpx.Client) -> None:
    x = [[0.1] * 64]  # 0.1 is not a float32: the server converts, the model would refuse
    r = client.post("/v1/models/mlp:predict", json={"inputs": {"x": x}})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "mlp"
    want = MODELS["mlp"].run({"x": np.asarray(x, np.float32)})["probs"]
    np.testing.assert_allclose(r.json()["outputs"]["probs"], want, rtol=1e-6, atol=1e-7)


def test_tf_serving_row_format_and_a_bare_curl_body(client: httpx.Client) -> None:
    """Issue 38: ``{"instances": [...]}`` (TF Serving / KServe v1 rows) was refused, and a
    JSON body sent with curl -d's form Content-Type was a 415."""
    want = MODELS["mlp"].run({"x": X})["probs"]
    r = client.post("/v1/models/mlp:predict", json={"instances": X.tolist()})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["predictions"], want, rtol=1e-6, atol=1e-7)
    body = json.dumps({"instances": X.tolist()}).encode()
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = client.post("/v1/models/mlp:predict", content=body, headers=form)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["predictions"], want, rtol=1e-6, atol=1e-7)
    row = {f"f{i}": [0.5 * i] for i in range(18)}
    r = client.post("/v1/models/ads:predict", json={"instances": [row]})
    assert r.status_code == 200, r.text
    feeds = {k: np.array([v], np.float32) for k, v in row.items()}
    np.testing.assert_allclose(r.json()["predictions"], MODELS["ads"].run(feeds)["a1"], rtol=1e-6)


@pytest.mark.parametrize(
    ("model", "body", "needle"),
    [
        ("mlp", {"instances": []}, "non-empty list of rows"),
        ("mlp", {"instances": [{"x": [0.0] * 64}, [0.0] * 64]}, "mixes objects and values"),
        ("ads", {"instances": [[0.0]]}, "this model has 18 inputs"),
        ("ads", {"instances": [{"f0": [1.0]}, {"f1": [1.0]}]}, "every row names the same"),
        ("mlp", {"instances": [[0.0] * 64], "inputs": {}}, 'beside "instances"'),
    ],
)
def test_bad_rows_are_400(client: httpx.Client, model: str, body: Any, needle: str) -> None:
    r = client.post(f"/v1/models/{model}:predict", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]
    assert_serving(client)


def test_a_batching_models_triton_config(client: httpx.Client) -> None:
    """With batching on, Triton's config gives max_batch_size and dims without the batch."""
    assert client.get("/v1/models/wide").json()["batching"]["enabled"]
    cfg = client.get("/v2/models/wide/config").json()
    assert cfg["max_batch_size"] == 4 and "dynamic_batching" in cfg
    spec = MODELS["wide"].inputs[0]
    assert cfg["input"][0]["dims"] == [d if isinstance(d, int) else -1 for d in spec.shape[1:]]


def test_npy_in_npy_out(client: httpx.Client) -> None:
    buf = io.BytesIO()
    np.save(buf, X)
    r = client.post(
        "/v1/models/mlp:predict",
        content=buf.getvalue(),
        headers={"content-type": "application/x-npy", "accept": "application/x-npy"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-npy"
    got = np.load(io.BytesIO(r.content))
    np.testing.assert_array_equal(got, MODELS["mlp"].run({"x": X})["probs"])


def test_npz_for_a_many_input_model(client: httpx.Client) -> None:
    feeds = {f"f{i}": np.full((1, 1), 10.0 * i, np.float32) for i in range(18)}
    buf = io.BytesIO()
    np.savez(buf, **feeds)  # type: ignore[arg-type]  # numpy's stub: kwds could be allow_pickle
    r = client.post(
        "/v1/models/ads:predict",
        content=buf.getvalue(),
        headers={"content-type": "application/x-npz", "accept": "application/x-npz"},
    )
    assert r.status_code == 200, r.text
    with np.load(io.BytesIO(r.content)) as got:
        for name, want in MODELS["ads"].run(feeds).items():
            np.testing.assert_array_equal(got[name], want)


def test_model_list_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "alive"}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert set(models) == {"mlp", "wide", "ints", "ads", "pick"}
    assert models["mlp"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 64]}]
    assert models["mlp"]["batching"]["enabled"] is False  # static batch of 1
    assert models["wide"]["batching"]["enabled"] is True  # cost model: heavy, batch dim
    assert models["wide"]["inputs"][0]["shape"] == ["N", 128]
    assert all(m["ready"] for m in models.values())
    assert client.get("/v1/models/ints").json()["outputs"][0]["dtype"] == "int8"


# -- bad input ------------------------------------------------------------------------------

BAD_JSON: list[tuple[str, Any, int, list[str]]] = [
    ("nope", {"inputs": {"x": [[1.0]]}}, 404, ["unknown model", "nope"]),
    ("mlp", {"inputs": {}}, 400, ["missing input", "'x'"]),
    ("mlp", {"inputs": {"x": X.tolist(), "z": [1]}}, 400, ["unknown input", "'z'"]),
    ("mlp", {"inputs": {"x": [["a"] * 64]}}, 400, ["'x'", "strings"]),
    ("mlp", {"inputs": {"x": [[True] * 64]}}, 400, ["'x'", "booleans"]),
    ("mlp", {"inputs": {"x": [[None] * 64]}}, 400, ["'x'"]),
    ("mlp", {"inputs": {"x": [[1e300] * 64]}}, 400, ["'x'", "out of range", "float32"]),
    ("mlp", {"inputs": {"x": [[0.5] * 63]}}, 400, ["'x'", "dim 1 is 63", "64"]),
    ("mlp", {"inputs": {"x": [0.5] * 64}}, 400, ["'x'", "rank"]),
    ("mlp", {"inputs": {"x": [[0.5] * 64, [0.5]]}}, 400, ["'x'", "rectangular"]),
    ("mlp", {"x": X.tolist()}, 400, ['"inputs"']),
    ("mlp", [1, 2], 400, ['"inputs"']),
    ("mlp", {"inputs": {"x": X.tolist()}, "extra": 1}, 400, ["extra"]),
    ("ints", {"inputs": {"x": [[1, 2, 300]]}}, 400, ["'x'", "300", "out of range", "int8"]),
    ("ints", {"inputs": {"x": [[1, 2, 2.5]]}}, 400, ["'x'", "integers"]),
]


@pytest.mark.parametrize(("model", "body", "status", "needles"), BAD_JSON)
def test_bad_json_input_is_4xx_naming_the_problem(
    client: httpx.Client, model: str, body: Any, status: int, needles: list[str]
) -> None:
    r = client.post(f"/v1/models/{model}:predict", json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    message = r.json()["error"]
    for needle in needles:
        assert needle in message
    assert_serving(client)


@pytest.mark.parametrize(
    ("content", "ctype", "status", "needle"),
    [
        (b'{"inputs": {"x": [[1, 2}', "application/json", 400, "malformed JSON"),
        (b"\xff\xfe", "application/json", 400, "malformed JSON"),
        (b"not an npy file", "application/x-npy", 400, "not a valid .npy"),
        (b"x=1", "application/x-www-form-urlencoded", 400, "malformed JSON"),  # curl -d's type
        (b"x=1", "image/png", 415, "Content-Type"),
    ],
)
def test_malformed_bodies_are_4xx(
    client: httpx.Client, content: bytes, ctype: str, status: int, needle: str
) -> None:
    r = client.post("/v1/models/mlp:predict", content=content, headers={"content-type": ctype})
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]
    assert_serving(client)


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_npy_with_the_wrong_dtype_or_for_many_inputs_is_400(client: httpx.Client) -> None:
    npy = {"content-type": "application/x-npy"}
    r = client.post("/v1/models/mlp:predict", content=_npy(X.astype(np.float64)), headers=npy)
    assert r.status_code == 400 and "'x'" in r.json()["error"]
    assert "float64" in r.json()["error"]
    r = client.post(
        "/v1/models/ads:predict", content=_npy(np.zeros((1, 1), np.float32)), headers=npy
    )
    assert r.status_code == 400 and "18 inputs" in r.json()["error"]
    assert_serving(client)


def test_wrong_method_and_unknown_route(client: httpx.Client) -> None:
    r = client.get("/v1/models/mlp:predict")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert "GET" in r.json()["error"]
    r = client.put("/v1/models")
    assert r.status_code == 405 and "PUT" in r.json()["error"]
    r = client.get("/v2/whatever")
    assert r.status_code == 404 and "/v2/whatever" in r.json()["error"]
    assert client.get("/v1/models/nope").status_code == 404
    assert_serving(client)


def test_oversized_body_is_413(client: httpx.Client) -> None:
    big = {"inputs": {"x": [[0.5] * 64] * 1000}}  # ~200 kB > the 64 kB limit
    r = client.post("/v1/models/mlp:predict", json=big)
    assert r.status_code == 413 and "limit of 65536 bytes" in r.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused once it passes the limit
        for _ in range(100):
            yield b" " * 1024

    r = client.post("/v1/models/mlp:predict", content=chunks())
    assert r.status_code == 413 and "limit" in r.json()["error"]
    assert_serving(client)


def test_oversized_body_is_refused_before_it_is_sent(url: str, client: httpx.Client) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        )  # and not one byte of the body
        reply = read_response(s)
    assert reply.startswith(b"HTTP/1.1 413"), reply
    assert b"1000000000 bytes" in reply
    assert_serving(client)


# -- micro-batching -------------------------------------------------------------------------


async def _post_all(url: str, model: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        return await asyncio.gather(
            *(c.post(f"/v1/models/{model}:predict", json={"inputs": b}) for b in bodies)
        )


def _batch_stats(client: httpx.Client, model: str) -> tuple[int, int]:
    b = client.get(f"/v1/models/{model}").json()["batching"]
    return b["batches"], b["batched_requests"]


def test_batching_gives_the_same_answers_as_unbatched(url: str, client: httpx.Client) -> None:
    rng = np.random.default_rng(1)
    for rows, n in ((1, 8), (2, 4)):  # 8 rows either way: two full batches of 4 rows
        xs = [rng.standard_normal((rows, 128)).astype(np.float32) for _ in range(n)]
        batches0, requests0 = _batch_stats(client, "wide")
        responses = asyncio.run(_post_all(url, "wide", [{"x": x.tolist()} for x in xs]))
        for x, r in zip(xs, responses):
            assert r.status_code == 200, r.text
            want = MODELS["wide"].run({"x": x})["y"]
            np.testing.assert_allclose(r.json()["outputs"]["y"], want, rtol=1e-5, atol=1e-5)
        batches, requests = _batch_stats(client, "wide")
        assert (batches - batches0, requests - requests0) == (2, n)


def test_a_bad_request_does_not_fail_its_batch_mates(url: str, client: httpx.Client) -> None:
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    bodies: list[dict[str, Any]] = [
        {"x": x[i : i + 1].tolist(), "idx": [[i % 4]]} for i in range(4)
    ]
    bodies[1] = {"x": x[1:2].tolist(), "idx": [[7]]}  # valid feeds, fails in the kernel
    bodies.append({"x": [[1.0, 2.0]], "idx": [[0]]})  # invalid: refused before batching
    responses = asyncio.run(_post_all(url, "pick", bodies))
    for i in (0, 2, 3):
        assert responses[i].status_code == 200, responses[i].text
        assert responses[i].json()["outputs"]["y"] == [[float(x[i, i % 4])]]
    assert responses[1].status_code == 422
    assert "GatherElements" in responses[1].json()["error"]
    assert responses[4].status_code == 400 and "'x'" in responses[4].json()["error"]
    assert_serving(client)


def test_micro_batcher_pads_to_a_power_of_two_and_splits_back() -> None:
    model = wide_mlp()
    seen: list[int] = []

    async def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(feeds["x"].shape[0])
        out: dict[str, np.ndarray] = await model.run_async(feeds)
        return out

    xs = [
        np.random.default_rng(i).standard_normal((r, 128)).astype(np.float32)
        for i, r in enumerate([1, 2, 2])
    ]

    async def main() -> list[dict[str, np.ndarray]]:
        batcher = MicroBatcher(run, ["x"], max_batch=8, max_wait_us=0)
        # the three submits queue before the batcher's task first runs: one batch, 5 rows
        return await asyncio.gather(*(batcher.submit([x]) for x in xs))

    results = asyncio.run(main())
    assert seen == [8]  # 5 rows padded to the next power of two
    for x, out in zip(xs, results):
        assert out["y"].shape[0] == x.shape[0]
        np.testing.assert_allclose(out["y"], model.run({"x": x})["y"], rtol=1e-5, atol=1e-5)


# -- readiness ------------------------------------------------------------------------------


def test_a_model_that_cannot_load_is_not_ready_but_alive() -> None:
    app = create_app({"broken": b"definitely not onnx", "mlp": make_models.mlp_small()})
    with ServerThread(app) as base, httpx.Client(base_url=base) as c:
        assert c.get("/healthz").status_code == 200
        r = c.get("/readyz")
        assert r.status_code == 503 and "'broken'" in r.json()["error"]
        r = c.post("/v1/models/broken:predict", json={"inputs": {}})
        assert r.status_code == 503 and "not ready" in r.json()["error"]
        r = c.post("/v1/models/mlp:predict", json={"inputs": {"x": X.tolist()}})
        assert r.status_code == 200  # the models that loaded still serve
