"""``GET /metrics``: Prometheus text, parsed with ``prometheus_client.parser``; its counters
and histograms checked against the requests this test sent (a server of its own, so the
counts are exact): requests by model, version, protocol and status; request-duration and
queue-time histograms; the batch-size histogram of a micro-batched model; the in-flight,
queue and readiness gauges; process figures."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper, numpy_helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

import tfrt_py
from tfrt_py.examples import make_models
from tfrt_py.serving import ModelConfig, ServerThread, create_app

X = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
BATCH = 4  # the batched model's max_batch: 8 one-row requests make two full batches


def rows_model() -> tfrt_py.Model:
    """y[N, 2] = x[N, 2] * 2: a batch dim, batched when asked."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    return tfrt_py.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    rows = ModelConfig(rows_model(), batching="on", max_batch=BATCH, max_wait_us=10_000_000)
    app = create_app({"mlp": tfrt_py.load(make_models.mlp_small()), "rows": rows})
    with ServerThread(app) as base:
        yield base


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    r = httpx.get(f"{url}/metrics", timeout=60)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Any, name: str, **labels: str) -> float:
    return float(samples.get((name, tuple(sorted(labels.items()))), 0.0))


async def _rows_requests(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        bodies = [{"inputs": {"x": [[float(i), 1.0]]}} for i in range(n)]
        return await asyncio.gather(*(c.post("/v1/models/rows:predict", json=b) for b in bodies))


def test_counters_and_histograms_match_the_requests_sent(url: str) -> None:
    before = scrape(url)
    c = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        for _ in range(3):  # v2: 3 answers, 2 refusals (a wrong shape, a wrong datatype)
            t = triton.InferInput("x", [1, 64], "FP32")
            t.set_data_from_numpy(X)
            c.infer("mlp", [t])
        for shape, dtype, arr in (([1, 63], "FP32", X[:, :63]), ([1, 64], "FP64", X * 1.0)):
            t = triton.InferInput("x", shape, dtype)
            t.set_data_from_numpy(arr.astype(np.float64) if dtype == "FP64" else arr)
            with pytest.raises(InferenceServerException):
                c.infer("mlp", [t])
        with pytest.raises(InferenceServerException):  # an unknown model: no model label
            c.infer("nope", [t])
    finally:
        c.close()
    with httpx.Client(base_url=url, timeout=60) as h:  # v1: 2 answers, 1 refusal
        bodies: tuple[dict[str, Any], ...] = ({"inputs": {"x": X.tolist()}},) * 2
        for body in (*bodies, {"inputs": {}}):
            h.post("/v1/models/mlp:predict", json=body)
    responses = asyncio.run(_rows_requests(url, 2 * BATCH))
    assert all(r.status_code == 200 for r in responses)

    after = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    mlp = {"model": "mlp", "version": "1"}
    assert delta("tfrt_py_requests_total", **mlp, protocol="v2", code="200") == 3
    assert delta("tfrt_py_requests_total", **mlp, protocol="v2", code="400") == 2
    assert delta("tfrt_py_requests_total", **mlp, protocol="v1", code="200") == 2
    assert delta("tfrt_py_requests_total", **mlp, protocol="v1", code="400") == 1
    assert delta("tfrt_py_unknown_model_requests_total", protocol="v2") == 1
    assert delta("tfrt_py_request_duration_seconds_count", **mlp, protocol="v2") == 5
    assert delta("tfrt_py_request_duration_seconds_count", **mlp, protocol="v1") == 3
    # queue time: one observation per request that reached its model call
    assert delta("tfrt_py_queue_duration_seconds_count", **mlp) == 5
    rows = {"model": "rows", "version": "1"}
    assert delta("tfrt_py_requests_total", **rows, protocol="v1", code="200") == 2 * BATCH
    assert delta("tfrt_py_queue_duration_seconds_count", **rows) == 2 * BATCH
    assert delta("tfrt_py_batch_size_count", **rows) == 2  # two full batches...
    assert delta("tfrt_py_batch_size_sum", **rows) == 2 * BATCH  # ...of BATCH rows each
    assert delta("tfrt_py_batch_size_bucket", **rows, le=f"{BATCH / 2:.1f}") == 0
    # histograms are cumulative: every request is in the +Inf bucket
    assert (
        value(after, "tfrt_py_request_duration_seconds_bucket", **mlp, protocol="v2", le="+Inf")
        >= 5
    )
    # Triton's counters (the parser names a counter's sample NAME_total)
    assert delta("nv_inference_request_success_total", **mlp) == 5
    assert delta("nv_inference_request_failure_total", **mlp) == 3
    assert delta("nv_inference_exec_count_total", **mlp) == 5
    assert delta("nv_inference_count_total", **mlp) == 5
    assert delta("nv_inference_exec_count_total", **rows) == 2  # a batch is one execution
    assert delta("nv_inference_count_total", **rows) == 2 * BATCH  # of BATCH inferences
    assert delta("nv_inference_request_duration_us_total", **mlp) > 0
    assert delta("nv_inference_compute_infer_duration_us_total", **rows) > 0
    assert value(after, "nv_inference_compute_input_duration_us_total", **mlp) == 0
    # compute time: one observation per request, a batch's time for each request in it
    assert delta("tfrt_py_compute_duration_seconds_count", **mlp) == 5
    assert delta("tfrt_py_compute_duration_seconds_count", **rows) == 2 * BATCH
    assert value(after, "tfrt_py_last_inference_timestamp_seconds", **mlp) > 1e9
    # gauges, read at the scrape
    for labels in (mlp, rows):
        assert value(after, "tfrt_py_model_ready", **labels) == 1
        assert value(after, "tfrt_py_requests_in_flight", **labels) == 0
        assert value(after, "tfrt_py_calls_in_flight", **labels) == 0
        assert value(after, "tfrt_py_requests_queued", **labels) == 0
        assert value(after, "nv_inference_pending_request_count", **labels) == 0
    assert value(after, "tfrt_py_server_ready") == 1
    assert value(after, "process_resident_memory_bytes") > 0
    assert value(after, "process_cpu_seconds_total") > 0


def test_triton_counters_are_written_under_tritons_own_names(url: str) -> None:
    """Triton users chart ``nv_inference_request_success`` (no ``_total``, which
    prometheus_client would add); ``/stats`` is read from the same counters."""
    c = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        t = triton.InferInput("x", [1, 64], "FP32")
        t.set_data_from_numpy(X)
        c.infer("mlp", [t])
        (stats,) = c.get_inference_statistics("mlp")["model_stats"]
    finally:
        c.close()
    text = httpx.get(f"{url}/metrics", timeout=60).text
    assert "# TYPE nv_inference_request_success counter" in text
    assert "nv_inference_request_success_total" not in text
    lines = dict(re.findall(r'(?m)^(nv_inference_\w+)\{model="mlp",version="1"\} (\S+)$', text))
    assert set(lines) >= {
        "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
    }  # fmt: skip
    assert float(lines["nv_inference_request_success"]) >= 1
    assert stats["inference_stats"]["success"]["count"] == float(
        lines["nv_inference_request_success"]
    )
    us = float(lines["nv_inference_compute_infer_duration_us"])
    assert abs(stats["inference_stats"]["compute_infer"]["ns"] - us * 1e3) <= 1
