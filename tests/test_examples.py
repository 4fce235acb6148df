"""The embedding examples (tfrt_py/examples/fastapi_app.py, flask_app.py) served for real
on loopback -- FastAPI under uvicorn, Flask under werkzeug's threaded server -- and called
with httpx: correct answers, 4xx with a message for bad input, concurrent requests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from werkzeug.serving import make_server

import tfrt_py
from tfrt_py import cold_start
from tfrt_py.concurrency import compiled_gate
from tfrt_py.examples import fastapi_app, flask_app
from tfrt_py.serving import ServerThread


@pytest.fixture(scope="module")
def fastapi_url() -> Iterator[str]:
    with ServerThread(fastapi_app.create_app()) as url:
        yield url


@pytest.fixture(scope="module")
def flask_url() -> Iterator[str]:
    server = make_server("127.0.0.1", 0, flask_app.create_app(), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def test_importing_the_flask_example_began_no_cold_start_in_the_test_process() -> None:
    """``flask_app`` loads its model at import, which every test process does while it
    collects this module: conftest's switches are set before that (``pytest_configure``).
    Set in a session fixture, they came after it, so the import began a cold start whose
    warm-up held the compiled kernels back from the process's other tests (on CI's cold
    numba cache, 116 compiled-kernel tests skipped and the packed gemm's test failed)."""
    assert cold_start.describe() == ""
    assert not compiled_gate.held()


def test_fastapi_predicts_like_the_model(fastapi_url: str) -> None:
    model = tfrt_py.load(fastapi_app.MODEL_PATH)
    x = np.random.default_rng(3).standard_normal((1, 64))
    with httpx.Client(base_url=fastapi_url) as c:
        r = c.post("/predict", json={"x": x.tolist()})
        assert r.status_code == 200, r.text
        want = model.run({"x": x.astype(np.float32)})["probs"]
        np.testing.assert_allclose(r.json()["probs"], want, rtol=1e-5, atol=1e-7)
        assert r.json()["label"] == int(want.argmax())
        assert c.get("/healthz").json() == {"status": "alive"}


def test_fastapi_bad_input_is_4xx_and_it_keeps_serving(fastapi_url: str) -> None:
    with httpx.Client(base_url=fastapi_url) as c:
        r = c.post("/predict", json={"x": [[0.5] * 63]})
        assert r.status_code == 400
        assert "'x'" in r.json()["detail"] and "64" in r.json()["detail"]
        assert c.post("/predict", json={"x": [["a"] * 64]}).status_code == 422  # pydantic
        assert c.post("/predict", content=b"{nope").status_code == 422
        r = c.post("/predict", json={"x": [[0.5] * 64]})
        assert r.status_code == 200 and len(r.json()["probs"][0]) == 10


def test_fastapi_concurrent_requests(fastapi_url: str) -> None:
    model = tfrt_py.load(fastapi_app.MODEL_PATH)
    xs = np.random.default_rng(4).standard_normal((24, 1, 64)).astype(np.float32)

    def call(x: np.ndarray) -> list[list[float]]:
        with httpx.Client(base_url=fastapi_url) as c:
            r = c.post("/predict", json={"x": x.tolist()})
            assert r.status_code == 200, r.text
            probs: list[list[float]] = r.json()["probs"]
            return probs

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(call, xs))
    for x, probs in zip(xs, got):
        np.testing.assert_allclose(probs, model.run({"x": x})["probs"], rtol=1e-5, atol=1e-7)


def _features(rng: np.random.Generator) -> dict[str, float]:
    return {f"f{i}": float(rng.uniform(0, 500)) for i in range(18)}


def test_flask_scores_like_the_model_from_many_threads(flask_url: str) -> None:
    model = tfrt_py.load(flask_app.MODEL_PATH)
    rng = np.random.default_rng(5)
    bodies = [_features(rng) for _ in range(24)]

    def call(features: dict[str, float]) -> float:
        with httpx.Client(base_url=flask_url) as c:
            r = c.post("/score", json={"features": features})
            assert r.status_code == 200, r.text
            return float(r.json()["score"])

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(call, bodies))
    for features, score in zip(bodies, got):
        feeds = {k: np.full((1, 1), v, np.float32) for k, v in features.items()}
        want = next(iter(model.run(feeds).values()))[0, 0]
        assert score == pytest.approx(float(want), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"features": {"f0": 1.0}}, 400, "missing input"),
        ({"features": {**{f"f{i}": 1.0 for i in range(18)}, "f99": 1.0}}, 400, "f99"),
        ({"features": {**{f"f{i}": 1.0 for i in range(18)}, "f3": "high"}}, 400, "'f3'"),
        ({"nothing": 1}, 400, "features"),
    ],
)
def test_flask_bad_input_is_4xx_and_it_keeps_serving(
    flask_url: str, body: dict[str, object], status: int, needle: str
) -> None:
    with httpx.Client(base_url=flask_url) as c:
        r = c.post("/score", json=body)
        assert r.status_code == status, r.text
        assert needle in r.json()["error"]
        r = c.post("/score", json={"features": {f"f{i}": 10.0 for i in range(18)}})
        assert r.status_code == 200 and 0.0 <= r.json()["score"] <= 1.0


def test_flask_oversized_body_is_413(flask_url: str) -> None:
    with httpx.Client(base_url=flask_url) as c:
        r = c.post(
            "/score", content=b"x" * (1 << 20) + b"x", headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        assert "bytes" in r.json()["error"]
        assert c.get("/healthz").json() == {"status": "alive"}
