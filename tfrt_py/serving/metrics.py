"""Prometheus metrics of a ModelServer, served by ``GET /metrics`` (text format 0.0.4).

Names and labels are part of the interface (docs/serving.md lists them); ``model`` and
``version`` are a served model's name and version (never a name a client made up: requests
for unknown models are counted without them), ``protocol`` is "v1", "v2" or "grpc",
``code`` the HTTP status (the one the same error would have over HTTP, for gRPC).

==========================================  =========  ================================
name                                        type       labels
==========================================  =========  ================================
tfrt_py_requests_total                      counter    model, version, protocol, code
tfrt_py_request_duration_seconds            histogram  model, version, protocol
tfrt_py_queue_duration_seconds              histogram  model, version
tfrt_py_compute_duration_seconds            histogram  model, version (per request)
tfrt_py_batch_size                          histogram  model, version (rows per batch call)
tfrt_py_requests_in_flight                  gauge      model, version
tfrt_py_calls_in_flight                     gauge      model, version
tfrt_py_requests_queued                     gauge      model, version
tfrt_py_model_ready                         gauge      model, version (1 ready, 0 not)
tfrt_py_last_inference_timestamp_seconds    gauge      model, version
tfrt_py_server_ready                        gauge      (none)
tfrt_py_unknown_model_requests_total        counter    protocol
nv_inference_request_success                counter    model, version (Triton's names:
nv_inference_request_failure                counter    model, version  what Triton users
nv_inference_count                          counter    model, version  chart; no _total
nv_inference_exec_count                     counter    model, version  suffix, as Triton
nv_inference_request_duration_us            counter    model, version  writes them)
nv_inference_queue_duration_us              counter    model, version
nv_inference_compute_input_duration_us      counter    model, version
nv_inference_compute_infer_duration_us      counter    model, version
nv_inference_compute_output_duration_us     counter    model, version
nv_inference_pending_request_count          gauge      model, version
process_* , python_gc_* , python_info       (prometheus_client's process, GC and platform)
==========================================  =========  ================================

A request's duration runs from the route's start (before the body is read) to its response
being ready (before it is sent); its queue time from admission (after validation) to the
start of the model call that carries it (a batch's call for a batched request); its compute
time is that call's (every request of a batch is given the batch's time, as Triton does).
Triton's counters: a request counts once in ``_success`` or ``_failure``; ``_count`` counts
rows (a batch of n rows is n inferences) and ``_exec_count`` model calls (a batch is one);
``_request_duration_us`` sums the successful requests' durations; compute input and output
stay 0 (decoding and encoding are in the request's time).
``GET /v2/models/NAME/stats`` (Triton's statistics) is read from these same metrics
(``ServerMetrics.inference_stats``), so it and ``/metrics`` always agree.

Each ServerMetrics has its own registry (two servers in one process do not mix).
prometheus_client's metrics are thread-safe; here they are updated on the event loop. The
gauges are set from the live models when ``/metrics`` is scraped (``LiveGauges.refresh``,
on the loop).

Under ``serve --workers N`` (``prefork``) a scrape reaches any one worker. There every
worker, right after the fork, keeps its metrics in prometheus_client's multiprocess files
(``share_across_workers``: one directory the master made, deleted when it ends), and a
scrape, and the Triton statistics, answer their sum over every worker: counters and
histograms of dead workers included (counts never go down); the gauges of live workers
only (summed; readiness the least of them, so 1 means every worker is ready), which each
worker sets once a second (``LiveGauges.every``) and the answering one at the scrape. The
master removes a dead worker's gauges (``forget_worker``). Only the process metrics stay
the answering worker's (its pid is in the response's ``x-tfrt-py-worker`` header).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "NO_METRICS",
    "REFRESH_S",
    "LiveGauges",
    "ModelMetrics",
    "ServerMetrics",
    "forget_worker",
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
#: Seconds between a pre-forked worker's settings of its gauges.
REFRESH_S = 1.0

#: Triton's counters (name -> help), written without prometheus_client's ``_total``. The
#: first three are recorded; the others are sums of tfrt_py's own metrics, made at the
#: scrape (``_triton_values``), so a request pays for each number once.
TRITON_COUNTERS = {
    "nv_inference_count": "Number of inferences performed (a batch of n rows is n)",
    "nv_inference_exec_count": "Number of model executions performed (a batch is one)",
    "nv_inference_request_duration_us": "Cumulative duration of successful requests in µs",
    "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
    "nv_inference_request_failure": "Number of failed inference requests, all batch sizes",
    "nv_inference_queue_duration_us": "Cumulative queuing duration in µs",
    "nv_inference_compute_input_duration_us": "Cumulative compute input duration in µs",
    "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration in µs",
    "nv_inference_compute_output_duration_us": "Cumulative compute output duration in µs",
}
_RECORDED = ("nv_inference_count", "nv_inference_exec_count", "nv_inference_request_duration_us")


class ModelMetrics:
    """The recorders of one served (model, version): ``request``, ``queued``, ``batch``,
    ``computed``. Each keeps its labelled children, so recording is a few increments."""

    def __init__(self, server: ServerMetrics, model: str, version: str) -> None:
        self._server = server
        self._labels = (model, version)
        lv = self._labels
        self._queue = server.queue_seconds.labels(*lv)
        self._compute = server.compute_seconds.labels(*lv)
        self._batch = server.batch_rows.labels(*lv)
        #: Unix time of the last successful request (a gauge set from it by LiveGauges)
        self.last_success = 0.0
        t = server.triton
        self._inferences = t["nv_inference_count"].labels(*lv)
        self._executions = t["nv_inference_exec_count"].labels(*lv)
        self._success_us = t["nv_inference_request_duration_us"].labels(*lv)
        self._requests: dict[tuple[str, int], Any] = {}
        self._durations: dict[str, Any] = {}

    def inference_stats(self, name: str, version: str) -> dict[str, Any]:
        """This model's entry of Triton's ``model_stats`` (statistics extension), read
        from the metrics (every worker's, under ``--workers``)."""
        return self._server.inference_stats(name, version)

    def computed(self, seconds: float, requests: int = 1, rows: int = 1) -> None:
        """One model call took ``seconds``, carrying ``requests`` requests (a batch's) of
        ``rows`` rows in all."""
        self._executions.inc()
        self._inferences.inc(rows)
        for _ in range(requests):
            self._compute.observe(seconds)

    def request(self, protocol: str, code: int, seconds: float) -> None:
        """One answered request of ``protocol`` with status ``code``."""
        if code < 400:
            self._success_us.inc(seconds * 1e6)
            self.last_success = time.time()
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

    def batch(self, rows: int) -> None:
        """One call of the micro-batcher, on ``rows`` rows (before padding)."""
        self._batch.observe(rows)


class _NoMetrics(ModelMetrics):
    """Records nothing (a ServedModel made outside a ModelServer)."""

    def __init__(self) -> None:
        self.last_success = 0.0

    def inference_stats(self, name: str, version: str) -> dict[str, Any]:
        return _stats(name, version, {})

    def computed(self, seconds: float, requests: int = 1, rows: int = 1) -> None:
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
        (``share_across_workers`` set this process up for it): the metrics are kept there
        and a scrape sums them over every worker."""
        self.registry = CollectorRegistry()
        self.shared = shared_dir is not None
        # shared: the values live in the directory's files, collected from there
        reg = self.registry if shared_dir is None else None
        mv = ["model", "version"]
        self.requests = Counter(
            "tfrt_py_requests",
            "Requests answered, by model, version, protocol and HTTP status code.",
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
        self.compute_seconds = Histogram(
            "tfrt_py_compute_duration_seconds",
            "Time of the model call that carried a request (a batch's, for each request in it).",
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
        self.triton = {
            name: Counter(name, TRITON_COUNTERS[name], mv, registry=reg) for name in _RECORDED
        }
        self.live = LiveGauges(models, ready, reg)
        if shared_dir is not None:
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self.registry, path=shared_dir)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def for_model(self, model: str, version: str) -> ModelMetrics:
        return ModelMetrics(self, model, version)

    def exposition(self) -> bytes:
        """The text format of every metric now (the gauges set first)."""
        self.live.refresh()
        families = list(self.registry.collect())
        plain = [f for f in families if f.name not in TRITON_COUNTERS]
        return generate_latest(_Families(plain)) + _triton_text(_triton_values(families))

    def inference_stats(self, name: str, version: str) -> dict[str, Any]:
        """Triton's ``model_stats`` entry of model ``name`` at ``version``, from this
        server's metrics (every worker's when shared): not a hot path (it collects every
        metric)."""
        self.live.refresh()
        families = list(self.registry.collect())
        return _stats(name, version, _triton_values(families).get((name, version), {}))


def _triton_values(families: list[Metric]) -> dict[tuple[str, str], dict[str, float]]:
    """(model, version) -> Triton's counters and the other sums the statistics need, from
    collected ``families``: success and failure from ``tfrt_py_requests_total`` by code,
    queue and compute times from the histograms' sums and counts."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for family in families:
        fname = family.name
        for sample in family.samples:
            labels = sample.labels
            if "model" not in labels or "le" in labels:
                continue
            n, value = sample.name, sample.value
            key: str | None = None
            if fname == "tfrt_py_requests" and n.endswith("_total"):
                ok = labels.get("code", "500") < "400"
                key = "nv_inference_request_success" if ok else "nv_inference_request_failure"
            elif fname in _RECORDED and n.endswith("_total"):
                key = fname
            elif n == "tfrt_py_queue_duration_seconds_sum":
                key, value = "nv_inference_queue_duration_us", value * 1e6
            elif n == "tfrt_py_compute_duration_seconds_sum":
                key, value = "nv_inference_compute_infer_duration_us", value * 1e6
            elif n in (
                "tfrt_py_queue_duration_seconds_count",
                "tfrt_py_compute_duration_seconds_count",
                "tfrt_py_request_duration_seconds_sum",
                "tfrt_py_last_inference_timestamp_seconds",
            ):
                key = n
            if key is not None:
                per = out.setdefault((labels["model"], labels.get("version", "")), {})
                if key == "tfrt_py_last_inference_timestamp_seconds":
                    per[key] = max(per.get(key, 0.0), value)
                else:
                    per[key] = per.get(key, 0.0) + value
    for per in out.values():
        for name in TRITON_COUNTERS:
            per.setdefault(name, 0.0)
    return out


def _stats(name: str, version: str, v: dict[str, float]) -> dict[str, Any]:
    """Triton's statistics entry from ``_triton_values``' sums ``v`` for one model."""

    def get(key: str) -> float:
        return v.get(key, 0.0)

    def ns(us: float) -> int:
        return round(us * 1e3)

    success_ns = ns(get("nv_inference_request_duration_us"))
    failed = int(get("nv_inference_request_failure"))
    all_ns = round(get("tfrt_py_request_duration_seconds_sum") * 1e9)
    zero = {"count": 0, "ns": 0}
    stats = {
        "success": {"count": int(get("nv_inference_request_success")), "ns": success_ns},
        "fail": {"count": failed, "ns": max(0, all_ns - success_ns) if failed else 0},
        "queue": {"count": int(get("tfrt_py_queue_duration_seconds_count")),
                  "ns": ns(get("nv_inference_queue_duration_us"))},
        "compute_input": zero,
        "compute_infer": {"count": int(get("tfrt_py_compute_duration_seconds_count")),
                          "ns": ns(get("nv_inference_compute_infer_duration_us"))},
        "compute_output": zero,
        "cache_hit": zero,
        "cache_miss": zero,
    }  # fmt: skip
    return {
        "name": name,
        "version": version,
        "last_inference": int(get("tfrt_py_last_inference_timestamp_seconds") * 1000),
        "inference_count": int(get("nv_inference_count")),
        "execution_count": int(get("nv_inference_exec_count")),
        "inference_stats": stats,
        "batch_stats": [],
    }


class _Families:
    """A fixed list of collected families, for ``generate_latest``."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _triton_text(values: dict[tuple[str, str], dict[str, float]]) -> bytes:
    """Triton's counters (``_triton_values``) in the text format under Triton's own names
    (prometheus_client would write ``NAME_total``), in a fixed order."""
    out = []
    for name, doc in TRITON_COUNTERS.items():
        out.append(f"# HELP {name} {doc}\n# TYPE {name} counter\n")
        for (model, version), per in sorted(values.items()):
            labels = f'model="{_escape(model)}",version="{_escape(version)}"'
            out.append(f"{name}{{{labels}}} {floatToGoString(per[name])}\n")
    return "".join(out).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class LiveGauges:
    """The gauges that say how things are now, set from the served models: requests in
    flight, calls in flight, queued (also as Triton's ``nv_inference_pending_request_count``),
    model and server readiness, the last successful request's time (the greatest of every
    worker's, dead ones included). ``refresh`` sets them (on the loop); under ``--workers``
    every worker refreshes ``every`` REFRESH_S seconds and a scrape sums the live workers'
    (readiness: the least of them)."""

    def __init__(
        self, models: Callable[[], Iterable[Any]], ready: Callable[[], bool], reg: Any
    ) -> None:
        self._models = models
        self._ready = ready
        mv = ["model", "version"]

        def gauge(name: str, doc: str, mode: Any = "livesum", labels: Any = mv) -> Gauge:
            return Gauge(name, doc, labels, registry=reg, multiprocess_mode=mode)

        self.in_flight = gauge(
            "tfrt_py_requests_in_flight", "Requests being handled (decoded, not yet answered)."
        )
        self.calls = gauge(
            "tfrt_py_calls_in_flight", "Model calls holding a slot (at most max_concurrency)."
        )
        self.queued = gauge(
            "tfrt_py_requests_queued",
            "Requests waiting for a slot or in the micro-batcher's queue.",
        )
        self.pending = gauge(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution.",
        )
        self.model_ready = gauge(
            "tfrt_py_model_ready", "1 when the model is loaded and warmed, else 0.", "livemin"
        )
        self.server_ready = gauge(
            "tfrt_py_server_ready", "1 when every model is ready, else 0.", "livemin", ()
        )
        self.last = gauge(
            "tfrt_py_last_inference_timestamp_seconds",
            "Unix time of the last successful request.",
            "max",
        )
        self._seen: set[tuple[str, str]] = set()

    def refresh(self) -> None:
        """Set every gauge from the models now; a model no longer served reads 0."""
        now = set()
        for m in list(self._models()):
            lv = (m.name, m.version)
            now.add(lv)
            self.in_flight.labels(*lv).set(m.in_flight_requests)
            self.calls.labels(*lv).set(m.admission.in_flight)
            queued = m.queued
            self.queued.labels(*lv).set(queued)
            self.pending.labels(*lv).set(queued)
            self.model_ready.labels(*lv).set(1.0 if m.warmed else 0.0)
            if m.metrics.last_success:
                self.last.labels(*lv).set(m.metrics.last_success)
        for lv in self._seen - now:
            for g in (self.in_flight, self.calls, self.queued, self.pending, self.model_ready):
                g.labels(*lv).set(0.0)
        self._seen |= now
        self.server_ready.set(1.0 if self._ready() else 0.0)

    async def every(self, seconds: float = REFRESH_S) -> None:
        """``refresh`` every ``seconds`` until cancelled (a pre-forked worker's task)."""
        while True:
            self.refresh()
            await asyncio.sleep(seconds)


def share_across_workers(directory: str) -> None:
    """In a pre-forked worker, before its ServerMetrics is made: prometheus_client keeps
    the values of metrics made from now on in this process's files under ``directory``
    (its multiprocess mode, which it otherwise decides from ``$PROMETHEUS_MULTIPROC_DIR``
    at import, before the fork). Process-wide: the worker serves one server."""
    from prometheus_client import values

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    values.ValueClass = values.MultiProcessValue()


def forget_worker(directory: str, pid: int) -> None:
    """In the master, once worker ``pid`` has ended: its gauges leave the sums (its
    counters and histograms stay)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, directory)
