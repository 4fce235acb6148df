"""``tfrt-py serve --workers 2``: one set of counters, whichever worker answers a scrape
(issue 38). Before, each worker kept its own counts, a scrape reached one worker at random
and the totals jumped between scrapes (Prometheus reads a drop as a counter reset).

A real server in a subprocess (two forked workers behind one socket), requests and scrapes
from httpx on fresh connections, the exposition parsed by prometheus_client's own parser.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import ROOT

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


def test_metrics_count_every_workers_requests_on_every_scrape() -> None:
    proc = subprocess.Popen(
        [BIN + "tfrt-py", "serve", MLP, "--port", "0", "--workers", "2", "--batching", "off"],
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
        name = os.path.splitext(os.path.basename(MLP))[0]
        meta = httpx.get(f"{base}/v2/models/{name}", timeout=10).json()
        body = {"inputs": [
            {"name": i["name"], "datatype": "FP32", "shape": [1, *i["shape"][1:]],
             "data": np.ones(int(np.prod(i["shape"][1:])), np.float32).tolist()}
            for i in meta["inputs"]
        ]}  # fmt: skip
        served: set[str] = set()
        for _ in range(REQUESTS):
            r = httpx.post(f"{base}/v2/models/{name}/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text[:300]
            served.add(r.headers[HEADER])
        assert served == workers  # both workers answered some (fresh connections)
        seen: dict[str, list[float]] = {}
        for _ in range(SCRAPES):
            r = httpx.get(base + "/metrics", timeout=10)
            seen.setdefault(r.headers[HEADER], []).append(_answered(r.text))
        counts = [c for cs in seen.values() for c in cs]
        assert counts == [REQUESTS] * SCRAPES, seen
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()
