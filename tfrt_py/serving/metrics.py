"""Prometheus metrics of a ModelServer, served by ``GET /metrics`` (text format 0.0.4).

Names and labels are part of the interface (docs/serving.md lists them); ``model`` and
``version`` are a served model's name and version (never a name a client made up: requests
for unknown models are counted without them), ``protocol`` is "v1" or "v2", ``code`` the
HTTP status.

==========================================  =========  ================================
name                                        type       labels
==========================================  =========  ================================
tfrt_py_requests_total                      counter    model, version, protocol, code
tfrt_py_request_duration_seconds            histogram  model, version, protocol
tfrt_py_queue_duration_seconds              histogram  model, version
tfrt_py_batch_size                          histogram  model, version (rows per batch call)
tfrt_py_requests_in_flight                  gauge      model, version
tfrt_py_calls_in_flight                     gauge      model, version
tfrt_py_requests_queued                     gauge      model, version
tfrt_py_model_ready                         gauge      model, version (1 ready, 0 not)
tfrt_py_server_ready                        gauge      (none)
tfrt_py_unknown_model_requests_total        counter    protocol
process_* , python_gc_* , python_info       (prometheus_client's process, GC and platform)
==========================================  =========  ================================

A request's duration runs from the route's start (before the body is read) to its response
being ready (before it is sent); its queue time from admission (after validation) to the
start of the model call that carries it (a batch's call for a batched request).

Each ServerMetrics has its own registry (two servers in one process do not mix).
prometheus_client's metrics are thread-safe; here they are updated on the event loop, and
the gauges are read from the live models when ``/metrics`` is scraped (on the loop).

Under ``serve --workers N`` (``prefork``) a scrape reaches any one worker, so each worker's
own counts would jump between scrapes, which Prometheus reads as counter resets. There
every worker, right after the fork, records its counters and histograms in
prometheus_client's multiprocess files (``share_across_workers``: one directory the master
made, deleted when it ends) and answers a scrape with their sum over every worker, dead
ones included (counts never go down). The gauges read at scrape time (in flight, queued,
ready) and the process metrics stay the answering worker's (its pid is in the response's
``x-tfrt-py-worker`` header); so do the Triton statistics of ``/v2/models/NAME/stats``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "NO_METRICS",
    "ModelMetrics",
    "ServerMetrics",
    "share_across_workers",
]

#: The exposition format's Content-Type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Seconds: from 100 µs (a tiny model inline) to a minute (past the default deadline).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Rows per batch call: powers of two (batches are padded to them).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ModelMetrics:
    """The metrics of one served (model, version): ``request``, ``queued``, ``batch``,
    ``computed``; besides Prometheus's, the totals of Triton's statistics extension
    (``inference_stats``, read by ``GET /v2/models/NAME/stats``)."""

    def __init__(self, server: ServerMetrics, model: str, version: str) -> None:
        self._server = server
        self._labels = (model, version)
        self._queue = server.queue_seconds.labels(model, version)
        self._batch = server.batch_rows.labels(model, version)
        self._requests: dict[tuple[str, int], Any] = {}
        self._durations: dict[str, Any] = {}
        #: Triton's names -> [count, nanoseconds]
        self.totals: dict[str, list[int]] = {
            k: [0, 0] for k in ("success", "fail", "queue", "compute_infer")
        }
        self.executions = 0  # model calls (a batch is one)
        self.last_inference_ms = 0  # wall clock of the last successful request

    def inference_stats(self, name: str, version: str) -> dict[str, Any]:
        """This model's entry of Triton's ``model_stats`` (statistics extension)."""
        zero = {"count": 0, "ns": 0}
        stats = {k: {"count": c, "ns": ns} for k, (c, ns) in self.totals.items()}
        stats.update(compute_input=zero, compute_output=zero, cache_hit=zero, cache_miss=zero)
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.totals["success"][0],
            "execution_count": self.executions,
            "inference_stats": stats,
            "batch_stats": [],
        }

    def computed(self, seconds: float) -> None:
        """One model call (a request's, or a batch's) took ``seconds``."""
        self.executions += 1
        t = self.totals["compute_infer"]
        t[0] += 1
        t[1] += int(seconds * 1e9)

    def request(self, protocol: str, code: int, seconds: float) -> None:
        """One answered request of ``protocol`` with status ``code``."""
        t = self.totals["success" if code < 400 else "fail"]
        t[0] += 1
        t[1] += int(seconds * 1e9)
        if code < 400:
            self.last_inference_ms = int(time.time() * 1000)
        key = (protocol, code)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._server.requests.labels(*self._labels, protocol, str(code))
            self._requests[key] = counter
        counter.inc()
        hist = self._durations.get(protocol)
        if hist is None:
            hist = self._server.request_seconds.labels(*self._labels, protocol)
            self._durations[protocol] = hist
        hist.observe(seconds)

    def queued(self, seconds: float) -> None:
        """One request's wait from admission to the start of its call."""
        self._queue.observe(seconds)
        t = self.totals["queue"]
        t[0] += 1
        t[1] += int(seconds * 1e9)

    def batch(self, rows: int) -> None:
        """One call of the micro-batcher, on ``rows`` rows (before padding)."""
        self._batch.observe(rows)


class _NoMetrics(ModelMetrics):
    """Records nothing (a ServedModel made outside a ModelServer)."""

    def __init__(self) -> None:
        self.totals = {k: [0, 0] for k in ("success", "fail", "queue", "compute_infer")}
        self.executions = 0
        self.last_inference_ms = 0

    def computed(self, seconds: float) -> None:
        pass

    def request(self, protocol: str, code: int, seconds: float) -> None:
        pass

    def queued(self, seconds: float) -> None:
        pass

    def batch(self, rows: int) -> None:
        pass


NO_METRICS: ModelMetrics = _NoMetrics()


class ServerMetrics:
    """The registry and metrics of one server. ``models()`` gives the served models now
    (objects with ``name``, ``version``, ``warmed``, ``in_flight_requests``, ``queued``,
    ``admission.in_flight``); ``ready()`` the server's readiness."""

    def __init__(
        self,
        models: Callable[[], Iterable[Any]],
        ready: Callable[[], bool],
        shared_dir: str | None = None,
    ) -> None:
        """``shared_dir``: the multiprocess directory of a pre-forked server's workers
        (``share_across_workers`` set this process up for it): the counters and
        histograms are kept there and a scrape sums them over every worker."""
        self.registry = CollectorRegistry()
        # shared: the counts live in the directory's files, collected from there
        reg = self.registry if shared_dir is None else None
        mv = ["model", "version"]
        self.requests = Counter(
            "tfrt_py_requests",
            "Requests answered, by model, version, protocol (v1, v2) and HTTP status code.",
            [*mv, "protocol", "code"],
            registry=reg,
        )
        self.request_seconds = Histogram(
            "tfrt_py_request_duration_seconds",
            "Time from a request's arrival at its route to its response being ready.",
            [*mv, "protocol"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.queue_seconds = Histogram(
            "tfrt_py_queue_duration_seconds",
            "Time a request waited between admission and the start of its model call.",
            mv,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.batch_rows = Histogram(
            "tfrt_py_batch_size",
            "Rows per call of the micro-batcher (before padding).",
            mv,
            buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.unknown = Counter(
            "tfrt_py_unknown_model_requests",
            "Requests naming a model the server does not know.",
            ["protocol"],
            registry=reg,
        )
        if shared_dir is not None:
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self.registry, path=shared_dir)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_Live(models, ready))

    def for_model(self, model: str, version: str) -> ModelMetrics:
        return ModelMetrics(self, model, version)

    def exposition(self) -> bytes:
        """The text format of every metric now."""
        return generate_latest(self.registry)


def share_across_workers(directory: str) -> None:
    """In a pre-forked worker, before its ServerMetrics is made: prometheus_client keeps
    the values of metrics made from now on in this process's files under ``directory``
    (its multiprocess mode, which it otherwise decides from ``$PROMETHEUS_MULTIPROC_DIR``
    at import, before the fork). Process-wide: the worker serves one server."""
    from prometheus_client import values

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    values.ValueClass = values.MultiProcessValue()


class _Live(Collector):
    """Gauges read from the served models at scrape time."""

    def __init__(self, models: Callable[[], Iterable[Any]], ready: Callable[[], bool]) -> None:
        self._models = models
        self._ready = ready

    def collect(self) -> Iterator[GaugeMetricFamily]:
        mv = ["model", "version"]
        gauges = {
            "requests_in_flight": "Requests being handled (decoded, not yet answered).",
            "calls_in_flight": "Model calls holding a slot (at most max_concurrency).",
            "requests_queued": "Requests waiting for a slot or in the micro-batcher's queue.",
            "model_ready": "1 when the model is loaded and warmed, else 0.",
        }
        families = {
            k: GaugeMetricFamily(f"tfrt_py_{k}", doc, labels=mv) for k, doc in gauges.items()
        }
        for m in list(self._models()):
            labels = [m.name, m.version]
            families["requests_in_flight"].add_metric(labels, m.in_flight_requests)
            families["calls_in_flight"].add_metric(labels, m.admission.in_flight)
            families["requests_queued"].add_metric(labels, m.queued)
            families["model_ready"].add_metric(labels, 1.0 if m.warmed else 0.0)
        yield from families.values()
        ready = GaugeMetricFamily("tfrt_py_server_ready", "1 when every model is ready, else 0.")
        ready.add_metric([], 1.0 if self._ready() else 0.0)
        yield ready
