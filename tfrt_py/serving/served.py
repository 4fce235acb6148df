"""ServedModel: one loaded model as the server runs it (validation, batching, warm-up).

Where a call runs: ``await model.run_async`` -- on the async executor that already keeps
the loop's thread for cheap kernels and hands expensive ones to the host's pool; on the
sync executor it runs inline on the loop, which is right for a tiny model (a thread hop
costs more than the model) and wrong for a big one (it would stall every other request).
So a sync call whose estimated cost reaches the cost model's pool threshold
(``EXPENSIVE_FLOPS``, scaled by its rows) runs on the server's thread pool instead; NumPy
releases the GIL in the heavy kernels, so the loop keeps reading requests meanwhile.

A model with a ``Loop`` anywhere in its graph runs on the pool whatever the cost model
says: its trip count or condition can come from the feeds, so one request can run for as
long as the request deadline allows, and it must not hold the event loop meanwhile.

Deadlines: every call passes ``timeout=`` (the request's remaining time, or the server's
``timeout`` for batches and warm-up-free calls) to ``model.run`` / ``model.run_async``,
which raise ``tfrt_py.errors.DeadlineExceeded`` and stop the model's work when it passes.

``warm()`` makes the first real request as fast as the rest (plans, codegen) and, when the
policy batches, checks that the model treats rows independently: two rows run as one batch
must equal the rows run alone, else batching is turned off with the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np

from ..compiler.cost import THRESHOLDS
from ..feeds import FeedChecker
from .batching import BatchPolicy, MicroBatcher, per_row_flops
from .codec import spec_json

__all__ = ["ServedModel"]

#: A call this heavy (FLOPs) goes to the pool: the cost model's "expensive" threshold.
EXPENSIVE_FLOPS = THRESHOLDS.expensive_us * THRESHOLDS.flops_per_us


class ServedModel:
    """``model`` served as ``name`` with batching ``policy``; heavy sync calls go to
    ``pool`` (None: always inline); ``timeout`` (seconds, None: none) is the deadline of a
    call that is not given one. ``predict`` and ``call`` run on the server's event loop;
    ``inflight`` (the pool calls not finished) is read by ``ModelServer.close``."""

    def __init__(
        self,
        name: str,
        model: Any,
        policy: BatchPolicy,
        pool: Executor | None = None,
        timeout: float | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.policy = policy
        self.inputs = list(model.inputs)
        self.outputs = list(model.outputs)
        self._names = [s.name for s in self.inputs]
        self._check = FeedChecker(model.graph.inputs)
        self._pool = pool
        self.row_flops = per_row_flops(model)
        self._offload = pool is not None and model.executor != "async"
        self.timeout = timeout
        #: A Loop's trip count may come from the feeds: always off the loop.
        self.runs_long = pool is not None and any(n.op_type == "Loop" for n in model.graph.walk())
        self.inflight: set[Future[Any]] = set()
        self.in_flight_requests = 0
        first = self.inputs[0].shape if self.inputs else None
        self._scales = bool(first) and not isinstance(first[0], int)  # type: ignore[index]
        self.batcher: MicroBatcher | None = None
        self._set_batcher()
        self.warm_error: str | None = None
        self.warmed = False

    def _set_batcher(self) -> None:
        p = self.policy
        self.batcher = (
            MicroBatcher(self.call, self._names, p.max_batch, p.max_wait_us) if p.enabled else None
        )

    def validate(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Feeds checked and converted, in input order (InputError naming the input)."""
        return self._check(feeds)

    async def predict(
        self, feeds: Mapping[str, Any], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        """One request's outputs; validated first, then batched (a batch's deadline is the
        server's ``timeout``) or run alone with ``timeout`` (None: the server's)."""
        self.in_flight_requests += 1
        try:
            arrays = self._check(feeds)
            if self.batcher is not None:
                return await self.batcher.submit(arrays)
            return await self.call(dict(zip(self._names, arrays)), timeout)
        finally:
            self.in_flight_requests -= 1

    async def call(
        self, feeds: dict[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model once on checked feeds with a deadline of ``timeout`` seconds
        (None: the server's): inline, or on the pool when heavy or ``runs_long``."""
        t = self.timeout if timeout is None else timeout
        kw: dict[str, Any] = {"timeout": t} if t is not None else {}
        pool = self._pool
        if pool is not None and (
            self.runs_long or (self._offload and self._flops(feeds) >= EXPENSIVE_FLOPS)
        ):
            fut = pool.submit(self.model.run, feeds, **kw)
            self.inflight.add(fut)
            fut.add_done_callback(self.inflight.discard)
            result: dict[str, np.ndarray] = await asyncio.wrap_future(fut)
            return result
        result = await self.model.run_async(feeds, **kw)
        return result

    def _flops(self, feeds: dict[str, np.ndarray]) -> float:
        """The estimated cost of this call: per-row FLOPs times the first input's first dim
        when that dim is dynamic (the cost model counted it as 1)."""
        if not self._scales:
            return self.row_flops
        first = feeds[self._names[0]]
        return self.row_flops * (first.shape[0] if first.ndim else 1)

    def warm(self) -> None:
        """One call on generated feeds (and the batch probe when batching); synchronous.
        A failure is recorded in ``warm_error`` (the server is then not ready)."""
        from ..bench.runners import random_feeds

        try:
            self.model.run(random_feeds(self.model, seed=0))
            if self.policy.enabled:
                self._probe_batch(random_feeds(self.model, seed=1, batch=2))
            if self.batcher is not None:  # plan every padded batch size before traffic
                b = self.batcher
                for size in sorted({b.bucket(r) for r in range(2, b.max_batch + 1)}):
                    self.model.run(random_feeds(self.model, batch=size))
        except Exception as e:  # noqa: BLE001 - reported by /readyz, naming the model
            self.warm_error = f"model {self.name!r}: warm-up call failed: {e}"
            return
        self.warmed = True

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
        p, b = self.policy, self.batcher
        return {
            "name": self.name,
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
            "in_flight": self.in_flight_requests,
        }
