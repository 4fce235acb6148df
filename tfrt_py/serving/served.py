"""ServedModel: one loaded model as the server runs it (validation, admission, batching,
the call itself, warm-up).

Where a call runs: ``await model.run_async(feeds, timeout=...)`` -- the runtime decides
(its InlinePolicy): inline on the loop when the cost model says the call is cheaper than a
hop to a worker, else on the host's pool (always for models with Loop/Scan or custom
kernels, whose cost it cannot bound); the async executor keeps cheap kernels on the loop.
The loop is never held for longer than a thread hop would cost.

Admission (``admission``): at most ``Admission.limit`` calls in flight, further requests
queued by priority, and a request that would wait behind ``max_queue`` others refused with
503 at once. Micro-batched requests queue in the batcher instead (one batch call at a time),
and each batch takes a slot like any call.

A call runs as its own task, awaited through ``asyncio.shield``: a request that gives up
(its deadline passed, its client left, shutdown) stops waiting, while the call keeps its
slot until the runtime ends it -- at the same deadline, since every call passes the
request's remaining time as ``timeout=`` (``DeadlineExceeded`` stops the model's work).
At shutdown ``ModelServer.drain`` waits for these tasks (bounded), then cancels the rest,
which stops their work at the next kernel or iteration.

``warm()`` makes the first real request as fast as the rest (plans, codegen) and, when the
policy batches, checks that the model treats rows independently: two rows run as one batch
must equal the rows run alone, else batching is turned off with the reason.

Threads: ``predict``, ``call`` and everything they touch run on the server's event loop;
``warm`` runs once, on a thread, before the model is served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DeadlineExceeded, InputError
from ..feeds import FeedChecker
from ..records import record
from .admission import Admission
from .batching import BatchInfo, BatchPolicy, MicroBatcher, batch_dim_problem, per_row_flops
from .codec import spec_json
from .errors import RequestError
from .limits import DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_QUEUE, DEFAULT_PRIORITY
from .metrics import NO_METRICS, ModelMetrics

__all__ = ["GenerationWarmup", "ServedModel"]


@record(frozen=True)
class GenerationWarmup:
    """``--warmup generate`` (``[MODEL:]generate``): a decoder's generation steps prepared
    before the model is ready (``Model.warmup_generation``: prompts of ``prompts`` tokens,
    one-token steps after ``pasts`` positions, at batch 1 and, where the server batches
    concurrent streams' steps, at ``batched`` rows). ``named``: given for this model, so a
    model that is not a decoder fails its warm-up; else it applies to the decoders only."""

    named: bool = False
    prompts: tuple[int, ...] = (16,)
    pasts: tuple[int, ...] = (16, 128)
    batched: int = 4


class ServedModel:
    """``model`` served as ``name`` (``version``) with batching ``policy``. ``timeout``
    (seconds, None: none) is the deadline of a call not given one; at most
    ``max_concurrency`` calls in flight (the model's own limiter's limit when it has one)
    and ``max_queue`` requests waiting. ``calls`` (shared with the ModelServer) holds the
    call tasks in flight; ``metrics`` records queue times and batch sizes."""

    def __init__(
        self,
        name: str,
        model: Any,
        policy: BatchPolicy,
        *,
        version: str = "1",
        timeout: float | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_queue: int = DEFAULT_MAX_QUEUE,
        calls: set[asyncio.Task[Any]] | None = None,
        metrics: ModelMetrics = NO_METRICS,
        warmup: Sequence[Mapping[str, Any] | GenerationWarmup] = (),
    ) -> None:
        self.name = name
        #: signatures ``warm`` prepares (``Model.warmup``, ``Model.warmup_generation``)
        #: before the model is ready
        self.warmup = list(warmup)
        self.version = version
        self.model = model
        self.policy = policy
        self.inputs = list(model.inputs)
        self.outputs = list(model.outputs)
        self._names = [s.name for s in self.inputs]
        #: the input whose first dim counts a request's rows (None: no batch dim)
        batched = self._names and batch_dim_problem(model) is None
        self._batch_input = self._names[0] if batched else None
        self._check = FeedChecker(model.graph.inputs)
        self.row_flops = per_row_flops(model)
        self.timeout = timeout
        limiter = getattr(model, "limiter", None)
        limit = limiter.limit if limiter is not None else max_concurrency
        self.admission = Admission(limit, max_queue)
        self.calls: set[asyncio.Task[Any]] = set() if calls is None else calls
        self.metrics = metrics
        self.in_flight_requests = 0
        self.batcher: MicroBatcher | None = None
        self._set_batcher()
        self.warm_error: str | None = None
        self.warmed = False

    def _set_batcher(self) -> None:
        p = self.policy
        self.batcher = (
            MicroBatcher(self._batch_call, self._names, p.max_batch, p.max_wait_us, with_info=True)
            if p.enabled
            else None
        )

    def _rows(self, feeds: Mapping[str, Any]) -> int:
        """The rows of one request's feeds: its first input's first dim when the model
        has a batch dim (Triton counts a batch of n as n inferences), else 1."""
        if self._batch_input is None:
            return 1
        shape = getattr(feeds.get(self._batch_input), "shape", ())
        return int(shape[0]) if shape else 1

    @property
    def queued(self) -> int:
        """Requests waiting now: for a slot, or in the micro-batcher's queue."""
        return self.admission.waiting + (self.batcher.queued if self.batcher else 0)

    def overloaded(self) -> RequestError | None:
        """The 503 a new request gets now, or None. A batching model's queue (its
        batcher's, and requests too big to batch waiting for a slot) holds at least
        ``max_batch`` requests, so batches can fill."""
        b, queued = self.batcher, self.queued
        if b is not None and queued < max(self.admission.max_queue, b.max_batch):
            return None
        return self.admission.overloaded(queued)

    async def predict(
        self, feeds: Mapping[str, Any], timeout: float | None = None, level: int = DEFAULT_PRIORITY
    ) -> dict[str, np.ndarray]:
        """One request's outputs: validated, admitted (RequestError 503 when the queue is
        full), then batched (a batch's deadline is the server's ``timeout``) or run alone
        with ``timeout`` (None: the server's), at priority ``level``."""
        self.in_flight_requests += 1
        try:
            checked = self._check.checked(feeds)  # the one validation of this request
            refused = self.overloaded()
            if refused is not None:
                raise refused
            if self.batcher is not None:
                return await self.batcher.submit(checked.arrays, level)
            loop = asyncio.get_running_loop()
            rows = self._rows(checked)
            return await self.call(checked, timeout, level=level, arrivals=(loop.time(),),
                                   rows=rows)  # fmt: skip
        finally:
            self.in_flight_requests -= 1

    async def _batch_call(
        self, feeds: dict[str, np.ndarray], info: BatchInfo
    ) -> dict[str, np.ndarray]:
        self.metrics.batch(info.rows)
        return await self.call(
            feeds, None, level=info.level, arrivals=info.arrivals, rows=info.rows
        )

    async def call(
        self,
        feeds: dict[str, np.ndarray],
        timeout: float | None = None,
        *,
        level: int = DEFAULT_PRIORITY,
        arrivals: Sequence[float] = (),
        rows: int = 1,
    ) -> dict[str, np.ndarray]:
        """Run the model once on checked feeds once a slot is free (waiting at ``level``),
        with a deadline ``timeout`` seconds from now (None: the server's timeout from the
        call's start); DeadlineExceeded if it passes while waiting. The queue time of the
        requests that ``arrivals`` (loop clock) stand for is recorded, and the call's
        compute time for each of them (``rows`` rows in all: Triton's inference count)."""
        loop = asyncio.get_running_loop()
        entry = loop.time()
        await self.admission.acquire(level)
        start = loop.time()
        for a in arrivals:
            self.metrics.queued(start - a)
        t = self.timeout if timeout is None else timeout - (start - entry)
        if t is not None and t <= 0:
            self.admission.release()
            raise DeadlineExceeded(timeout or 0.0)
        kw: dict[str, Any] = {} if t is None else {"timeout": t}
        task = loop.create_task(self.model.run_async(feeds, **kw))
        self.calls.add(task)

        def finished(task: asyncio.Task[Any]) -> None:
            self.calls.discard(task)
            took = loop.time() - start
            self.admission.release(took)
            self.metrics.computed(took, max(1, len(arrivals)), rows)
            if not task.cancelled():
                task.exception()  # retrieved: a call whose request left is not logged

        task.add_done_callback(finished)
        result: dict[str, np.ndarray] = await asyncio.shield(task)
        return result

    def warm(self) -> None:
        """A cold start's switch to the compiled kernels awaited (``Model.wait_compiled``),
        one call on generated feeds (and the batch probe when batching), then the
        configured signatures (``Model.warmup``: plans checked, native code compiled);
        synchronous. A failure is recorded in ``warm_error`` (the server is then not
        ready)."""
        from ..bench.runners import random_feeds

        try:
            self.model.wait_compiled(native=False)  # a cold start: on the compiled kernels
            self.model.run(random_feeds(self.model, seed=0))
            if self.policy.enabled:
                self._probe_batch(random_feeds(self.model, seed=1, batch=2))
            if self.batcher is not None:  # plan every padded batch size before traffic
                b = self.batcher
                for size in sorted({b.bucket(r) for r in range(2, b.max_batch + 1)}):
                    self.model.run(random_feeds(self.model, batch=size))
            shapes = [w for w in self.warmup if not isinstance(w, GenerationWarmup)]
            if shapes:
                self.model.warmup(shapes)
            for w in self.warmup:
                if isinstance(w, GenerationWarmup):
                    self._warm_generation(w)
        except Exception as e:  # noqa: BLE001 - reported by /readyz, naming the model
            self.warm_error = f"model {self.name!r}: warm-up call failed: {e}"
            return
        self.warmed = True

    def _warm_generation(self, w: GenerationWarmup) -> None:
        """``Model.warmup_generation`` for a decoder (its batched steps too where the
        generate routes batch them); a model that is not a decoder: an error if ``w``
        names it, else nothing to do."""
        from .gen_batching import GenerationBatcher

        try:
            self.model.decoder()
        except InputError as e:
            if w.named:
                raise InputError(f"--warmup generate: {e}") from None
            return
        batches = (1, w.batched) if GenerationBatcher.fits(self.model) and w.batched > 1 else (1,)
        self.model.warmup_generation(w.prompts, w.pasts, batches)

    def _probe_batch(self, feeds: dict[str, np.ndarray]) -> None:
        both = self.model.run(feeds)
        rows = [self.model.run({k: v[i : i + 1] for k, v in feeds.items()}) for i in range(2)]
        for name, v in both.items():
            ok = isinstance(v, np.ndarray) and v.ndim > 0 and v.shape[0] == 2
            ok = ok and all(
                np.allclose(v[i : i + 1], r[name], rtol=1e-4, atol=1e-6, equal_nan=True)
                for i, r in enumerate(rows)
            )
            if not ok:
                p = self.policy
                why = (
                    f"off: batch probe: output {name!r} of 2 stacked rows differs from the "
                    f"rows run alone (the model mixes rows)"
                )
                self.policy = BatchPolicy(False, p.max_batch, p.max_wait_us, why)
                self._set_batcher()
                return

    def describe(self) -> dict[str, Any]:
        """The model as ``GET /v1/models`` lists it."""
        p, b, a = self.policy, self.batcher, self.admission
        return {
            "name": self.name,
            "version": self.version,
            "inputs": [spec_json(s) for s in self.inputs],
            "outputs": [spec_json(s) for s in self.outputs],
            "executor": self.model.executor,
            "mflop_per_row": round(self.row_flops / 1e6, 4),
            "batching": {
                "enabled": p.enabled,
                "max_batch": p.max_batch,
                "max_wait_us": p.max_wait_us,
                "why": p.why,
                "batches": b.batches if b else 0,
                "batched_requests": b.batched_requests if b else 0,
            },
            "ready": self.warmed,
            "warmup": len(self.warmup),
            "in_flight": self.in_flight_requests,
            "calls_in_flight": a.in_flight,
            "queued": self.queued,
            "max_concurrency": a.limit,
            "max_queue": a.max_queue,
        }
