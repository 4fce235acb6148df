"""Backpressure (issue 16): at most ``max_concurrency`` model calls in flight per model
(the runtime's ``load(max_concurrency=)`` for models the server loads), at most
``max_queue`` requests waiting, and a request past that answered 503 with ``Retry-After``
and a JSON error at once, without running the model; priorities honoured by the
micro-batcher; a deadline reached while queued; and the shutdown drain (bounded) of calls
in flight.

The model: y = Hold(x), a custom kernel that blocks until the test opens its gate and
records the rows it saw, so each test watches the queue fill (the server's own counters)
instead of timing anything. Waits are generous upper bounds on a hang.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

import tfrt_py
from tests.support.waiting import until
from tfrt_py.concurrency import HostContext
from tfrt_py.serving import ModelConfig, ModelServer, ServerThread, create_app


class Gate:
    """A custom kernel ``y = 2 x`` that waits for ``open`` and records each call's x."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()  # warm-up passes; tests close it
        self.inside = 0
        self.most = 0
        self.seen: list[list[float]] = []
        self._lock = threading.Lock()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.seen.append(x[..., 0].ravel().tolist())
        self.open.wait(60)
        with self._lock:
            self.inside -= 1
        return x * 2

    def close(self) -> None:
        """Close the gate and forget what warm-up ran."""
        with self._lock:
            self.open.clear()
            self.seen.clear()
            self.most = 0


def gate_model(batch: bool = False) -> bytes:
    shape: list[Any] = ["N", 2] if batch else [2]
    node = helper.make_node("Hold", ["x"], ["y"], domain="app")
    graph = helper.make_graph(
        [node],
        "gate",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("app", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def gate_server(
    gate: Gate, host: HostContext, model: bytes | ModelConfig | None = None, **options: Any
) -> ModelServer:
    """A server of one model, "gate" (``gate_model()`` unless ``model``), whose Hold
    kernel is ``gate``, loaded on ``host``."""
    return ModelServer(
        {"gate": gate_model() if model is None else model},
        load_options={"custom_kernels": {("app", "Hold"): gate}, "host": host},
        **options,
    )


@pytest.fixture
def host() -> Iterator[HostContext]:
    with HostContext(num_workers=6, name="backpressure-test") as h:
        yield h


def post_in_thread(url: str, path: str, body: Any, out: list[httpx.Response]) -> threading.Thread:
    def send() -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            out.append(c.post(path, json=body))

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


def v2_body(x: list[float], **params: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [len(x)], "data": x}]
    }
    if params:
        doc["parameters"] = params
    return doc


def test_a_full_queue_is_503_with_retry_after_at_once(host: HostContext) -> None:
    gate = Gate()
    server = gate_server(gate, host, max_concurrency=1, max_queue=2)
    app = create_app(server)
    answers: list[httpx.Response] = []
    threads = []
    try:
        with ServerThread(app) as url:
            served = server.get("gate")
            assert served is not None
            assert served.model.limiter.limit == 1  # the runtime's bound, from load()
            gate.close()
            threads.append(post_in_thread(url, "/v2/models/gate/infer", v2_body([1, 1]), answers))
            until(lambda: gate.inside == 1, "the first call holds the slot")
            for i in (2, 3):
                threads.append(
                    post_in_thread(url, "/v2/models/gate/infer", v2_body([i, i]), answers)
                )
            until(lambda: served.queued == 2, "two requests queued")

            with httpx.Client(base_url=url, timeout=120) as c:
                r = c.post("/v2/models/gate/infer", json=v2_body([4, 4]))
                assert r.status_code == 503, r.text
                assert int(r.headers["retry-after"]) >= 1
                assert r.headers["content-type"] == "application/json"
                assert "overloaded" in r.json()["error"] and "max_queue 2" in r.json()["error"]
                r = c.post("/v1/models/gate:predict", json={"inputs": {"x": [5, 5]}})
                assert r.status_code == 503 and "retry-after" in r.headers
            client = triton.InferenceServerClient(url.removeprefix("http://"))
            try:
                t = triton.InferInput("x", [2], "FP32")
                t.set_data_from_numpy(np.array([6, 6], np.float32))
                with pytest.raises(InferenceServerException) as info:
                    client.infer("gate", [t])
                assert info.value.status() == "503"
            finally:
                client.close()
            assert gate.seen == [[1.0]]  # the refused requests never reached the model
            assert served.admission.in_flight == 1 and served.queued == 2

            gate.open.set()
            for t in threads:
                t.join(120)
            assert sorted(r.json()["outputs"][0]["data"][0] for r in answers) == [2, 4, 6]
            with httpx.Client(base_url=url, timeout=120) as c:
                r = c.post("/v2/models/gate/infer", json=v2_body([7, 7]))
                assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [14, 14]
                metrics = c.get("/metrics").text
            line = 'tfrt_py_requests_total{code="503",model="gate",protocol="v2",version="1"} 2.0'
            assert line in metrics
    finally:
        gate.open.set()


def test_max_concurrency_bounds_the_calls_in_flight(host: HostContext) -> None:
    gate = Gate()
    model = tfrt_py.load(
        gate_model(), custom_kernels={("app", "Hold"): gate}, host=host, max_concurrency=2
    )
    server = ModelServer({"gate": model}, max_concurrency=5)  # the model's own limit wins
    answers: list[httpx.Response] = []
    try:
        with ServerThread(create_app(server)) as url:
            served = server.get("gate")
            assert served is not None and served.admission.limit == 2
            gate.close()
            threads = [
                post_in_thread(url, "/v1/models/gate:predict", {"inputs": {"x": [i, i]}}, answers)
                for i in range(5)
            ]
            until(lambda: gate.inside == 2 and served.queued == 3, "2 running, 3 queued")
            with httpx.Client(base_url=url, timeout=60) as c:
                described = c.get("/v1/models/gate").json()
            assert described["calls_in_flight"] == 2 and described["queued"] == 3
            assert described["max_concurrency"] == 2
            gate.open.set()
            for t in threads:
                t.join(120)
    finally:
        gate.open.set()
    assert gate.most == 2
    assert sorted(r.json()["outputs"]["y"][0] for r in answers) == [0, 2, 4, 6, 8]


def test_the_batcher_takes_higher_priorities_first(host: HostContext) -> None:
    gate = Gate()
    config = ModelConfig(gate_model(batch=True), batching="on", max_batch=2, max_wait_us=0)
    server = gate_server(gate, host, config, max_concurrency=1)
    answers: list[httpx.Response] = []
    try:
        with ServerThread(create_app(server)) as url:
            served = server.get("gate")
            assert served is not None and served.batcher is not None
            gate.close()
            path = "/v2/models/gate/infer"

            def row(i: int, **params: Any) -> dict[str, Any]:
                doc = v2_body([i, i], **params)
                doc["inputs"][0]["shape"] = [1, 2]
                return doc

            def queued(n: int) -> Callable[[], bool]:
                return lambda: served.queued == n

            threads = [post_in_thread(url, path, row(1), answers)]
            until(lambda: gate.inside == 1, "the first batch runs")
            for i in (2, 3):  # one at a time: their arrival order is part of the test
                threads.append(post_in_thread(url, path, row(i), answers))
                until(queued(i - 1), f"request {i} queued")
            threads.append(post_in_thread(url, path, row(4, priority=1), answers))
            until(queued(3), "a priority-1 request queued after them")
            gate.open.set()
            for t in threads:
                t.join(120)
    finally:
        gate.open.set()
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    # batches of 2 rows: the priority-1 request goes with the next batch, ahead of 3
    assert gate.seen == [[1.0], [4.0, 2.0], [3.0]]


def test_a_deadline_reached_in_the_queue_is_504_and_leaves_the_queue(host: HostContext) -> None:
    gate = Gate()
    server = gate_server(gate, host, max_concurrency=1)
    answers: list[httpx.Response] = []
    try:
        with ServerThread(create_app(server)) as url:
            served = server.get("gate")
            assert served is not None
            gate.close()
            holder = post_in_thread(url, "/v2/models/gate/infer", v2_body([1, 1]), answers)
            until(lambda: gate.inside == 1, "the first call holds the slot")
            with httpx.Client(base_url=url, timeout=120) as c:
                r = c.post("/v2/models/gate/infer", json=v2_body([2, 2], timeout=100_000))
            assert r.status_code == 504 and "'gate'" in r.json()["error"], r.text
            assert served.queued == 0
            gate.open.set()
            holder.join(120)
            assert answers[0].status_code == 200
    finally:
        gate.open.set()
    assert gate.seen == [[1.0]]


def _drain_case(host: HostContext, close_timeout: float, open_gate: bool) -> list[str]:
    """A call in flight at shutdown: drain with the gate opened (it finishes) or kept
    shut (it is cancelled after ``close_timeout``); the log lines."""
    gate = Gate()
    log: list[str] = []
    server = gate_server(gate, host, close_timeout=close_timeout, log=log.append)
    server.start()
    served = server.get("gate")
    assert served is not None and served.warmed
    gate.close()

    async def main() -> Any:
        request = asyncio.ensure_future(served.predict({"x": np.ones(2, np.float32)}))
        while gate.inside == 0:
            await asyncio.sleep(0.01)
        request.cancel()  # what uvicorn does to requests still running after its drain
        drain = asyncio.ensure_future(server.drain())
        await asyncio.sleep(0)
        assert not drain.done()  # it waits for the call, not for the request
        if open_gate:
            gate.open.set()
        await asyncio.wait_for(drain, 120)
        assert not server.calls

    try:
        asyncio.run(main())
    finally:
        gate.open.set()
        server.close()
    return log


def test_drain_waits_for_calls_in_flight(host: HostContext) -> None:
    log = _drain_case(host, close_timeout=120, open_gate=True)
    assert not any("still running" in line for line in log)


def test_drain_is_bounded(host: HostContext) -> None:
    log = _drain_case(host, close_timeout=0.2, open_gate=False)
    assert any("1 model call(s) still running after 0.2 s; cancelling" in x for x in log), log
