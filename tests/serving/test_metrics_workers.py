"""``tfrt-py serve --workers 2``: one set of metrics, whichever worker answers a scrape
(issue 38). Before, each worker kept its own counts, a scrape reached one worker at random
and the totals jumped between scrapes (Prometheus reads a drop as a counter reset); then
the counters were shared, but Triton's statistics (``/v2/models/NAME/stats``) and the
gauges (in flight, queued) stayed the answering worker's.

A real server in a subprocess (two forked workers behind one socket), requests and scrapes
from httpx on fresh connections, the exposition parsed by prometheus_client's own parser.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import ROOT
from tfrt_py.serving.metrics import REFRESH_S

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork: Linux")

MLP = str(ROOT / "tfrt_py" / "examples" / "mlp_small.onnx")
BIN = os.path.join(os.path.dirname(sys.executable), "")
HEADER = "x-tfrt-py-worker"
REQUESTS = 100
SCRAPES = 10


def _answered(exposition: str) -> float:
    """tfrt_py_requests_total summed over its series with a 2xx code."""
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "tfrt_py_requests_total" and sample.labels["code"][0] == "2":
                total += sample.value
    return total


@contextlib.contextmanager
def serving(*args: str) -> Iterator[tuple[str, list[str]]]:
    """A real ``tfrt-py serve ... --workers 2`` (base URL, its output lines so far), ready:
    both workers have answered ``/readyz``. Stopped by SIGTERM at the end."""
    proc = subprocess.Popen(
        [BIN + "tfrt-py", "serve", *args, "--port", "0", "--workers", "2", "--no-grpc"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            m = re.search(r"on (http://\S+)", line)
            if m and not url:
                url.append(m.group(1))
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert found.wait(120), "\n".join(lines)
        base = url[0]
        workers: set[str] = set()
        end = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < end:
            r = httpx.get(base + "/readyz", timeout=5)
            if r.status_code == 200:
                workers.add(r.headers[HEADER])
            time.sleep(0.02)
        assert len(workers) == 2, "\n".join(lines)
        yield base, lines
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()


def _samples(exposition: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name
    ]


def test_metrics_count_every_workers_requests_on_every_scrape() -> None:
    with serving(MLP, "--batching", "off") as (base, _):
        name = os.path.splitext(os.path.basename(MLP))[0]
        meta = httpx.get(f"{base}/v2/models/{name}", timeout=10).json()
        body = {"inputs": [
            {"name": i["name"], "datatype": "FP32", "shape": [1, *i["shape"][1:]],
             "data": np.ones(int(np.prod(i["shape"][1:])), np.float32).tolist()}
            for i in meta["inputs"]
        ]}  # fmt: skip
        served: set[str] = set()
        sent = 0
        # REQUESTS, and more until both workers have answered some: which worker accepts a
        # fresh connection is the kernel's choice, and a busy host can leave one idle for
        # a hundred in a row
        while sent < REQUESTS or (len(served) < 2 and sent < 20 * REQUESTS):
            r = httpx.post(f"{base}/v2/models/{name}/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text[:300]
            served.add(r.headers[HEADER])
            sent += 1
        assert len(served) == 2, f"one worker answered all {sent} requests"
        seen: dict[str, list[tuple[float, ...]]] = {}
        for _ in range(SCRAPES):
            r = httpx.get(base + "/metrics", timeout=10)
            success = re.findall(r"(?m)^nv_inference_request_success\{.*\} (\S+)$", r.text)
            ready = _samples(r.text, "tfrt_py_model_ready")
            stats = httpx.get(f"{base}/v2/models/{name}/stats", timeout=10).json()
            (entry,) = stats["model_stats"]
            seen.setdefault(r.headers[HEADER], []).append((
                _answered(r.text),
                sum(map(float, success)),  # Triton's name, as Triton writes it (no _total)
                entry["inference_stats"]["success"]["count"],  # Triton's statistics
                entry["inference_count"],
                entry["execution_count"],
                *(v for _, v in ready),  # one series (no pid label): every worker ready
            ))  # fmt: skip
        counts = [c for cs in seen.values() for c in cs]
        assert counts == [(sent,) * 5 + (1.0,)] * SCRAPES, seen


def test_gauges_sum_the_live_workers_and_forget_dead_ones(tmp_path: Any) -> None:
    """A request held in one worker's batcher (a 30 s batch wait) is queued and in flight
    on every scrape, whichever worker answers it (each worker sets its gauges every
    second); once both workers are killed and replaced, the dead holder's gauges are gone
    (the master forgets them) and the sums read 0."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "rows", [x], [y])
    path = str(tmp_path / "rows.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    args = (path, "--batching", "on", "--max-batch", "4", "--max-wait-us", "30000000")
    with serving(*args) as (base, lines):
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        held = threading.Thread(
            target=lambda: _post_quietly(f"{base}/v2/models/rows/infer", body), daemon=True
        )
        held.start()

        def gauges() -> tuple[str, float, float]:
            r = httpx.get(base + "/metrics", timeout=10)
            queued = _samples(r.text, "tfrt_py_requests_queued")
            flight = _samples(r.text, "tfrt_py_requests_in_flight")
            return r.headers[HEADER], sum(v for _, v in queued), sum(v for _, v in flight)

        end = time.monotonic() + 20
        while gauges()[1:] != (1.0, 1.0) and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(2 * REFRESH_S)  # the holder has set its gauges since
        by_worker: dict[str, list[tuple[float, float]]] = {}
        for _ in range(40):
            answered_by, queued, flight = gauges()
            by_worker.setdefault(answered_by, []).append((queued, flight))
            if len(by_worker) == 2 and min(len(v) for v in by_worker.values()) >= 3:
                break
        assert len(by_worker) == 2, by_worker
        assert all(v == [(1.0, 1.0)] * len(v) for v in by_worker.values()), by_worker

        pids = [int(m.group(1)) for ln in lines if (m := re.search(r"started \(pid (\d+)", ln))]
        assert len(pids) == 2, lines
        for worker in pids:
            os.kill(worker, signal.SIGKILL)
        end = time.monotonic() + 120
        while time.monotonic() < end:
            started = [ln for ln in lines if re.search(r"started \(pid (\d+)", ln)]
            if len(started) >= 4:
                break
            time.sleep(0.1)
        ready: set[str] = set()
        while len(ready) < 2 and time.monotonic() < end:
            r = httpx.get(base + "/readyz", timeout=5)
            if r.status_code == 200:
                ready.add(r.headers[HEADER])
            time.sleep(0.05)
        assert len(ready) == 2, lines
        held.join(30)
        assert [gauges()[1:] for _ in range(6)] == [(0.0, 0.0)] * 6


def _post_quietly(url: str, body: dict[str, Any]) -> None:
    """POST that may lose its connection (its worker is killed)."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url, json=body, timeout=60)
