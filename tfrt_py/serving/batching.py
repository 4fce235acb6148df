"""Micro-batching: concurrent requests to one model run as one call on stacked rows.

``choose_policy`` decides per model, from its input signature and the load-time cost
model: batching needs a batch dimension (every input's and output's first dim dynamic, the
inputs' the same symbol) and pays only when a call's compute is large next to the work
around it. A model below ``BATCH_MIN_FLOPS`` per row (e.g. the bundled mlp_small, 0.17
MFLOP) costs less than the HTTP request that carries it (~100 µs of Python), so gathering
would only add waiting; above it, one call on B rows reads the weights once instead of B
times (matrix-matrix instead of matrix-vector products).

``MicroBatcher`` gathers requests on the running event loop: the first request waits at
most ``max_wait_us`` for company, a batch holds at most ``max_batch`` rows, and requests
that arrive while a batch runs form the next one. A batch is padded (with copies of its
last row) to a power of two rows, so the executor sees a handful of input signatures and
reuses their plans instead of planning each batch size anew. Each request is validated before it
joins (a bad request never reaches a batch); a batch whose call fails is re-run request by
request, so every request gets its own answer or its own error -- except a batch that ran
past its deadline (a TimeoutError): re-running it row by row would take longer still, so
every request in it gets the error. A request's ``priority`` level (lower first) decides
which queued requests the next batch takes; arrival order breaks ties.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from ..compiler.cost import graph_cost
from ..kernels import default_registry
from ..records import record
from .limits import DEFAULT_PRIORITY

__all__ = [
    "BATCH_MIN_FLOPS",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_WAIT_US",
    "BatchInfo",
    "BatchPolicy",
    "MicroBatcher",
    "batch_dim_problem",
    "choose_policy",
    "per_row_flops",
]

#: Per-row FLOPs above which batching pays: ~1/4 of the cost model's pool-hop threshold.
BATCH_MIN_FLOPS = 0.5e6
DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_WAIT_US = 500
MODES = ("auto", "on", "off")

RunFn = Callable[..., Awaitable[dict[str, np.ndarray]]]


@record(frozen=True)
class BatchPolicy:
    """Whether a served model batches, its limits, and why (for ``GET /v1/models``)."""

    enabled: bool
    max_batch: int
    max_wait_us: int
    why: str


def per_row_flops(model: Any) -> float:
    """The cost model's FLOPs for one call with every dynamic dim 1 (one row)."""
    return graph_cost(model.graph, default_registry()).flops


def batch_dim_problem(model: Any) -> str | None:
    """Why ``model`` has no batch dimension to stack requests on, or None if it has one."""
    symbols = set()
    for kind, specs in (("input", model.inputs), ("output", model.outputs)):
        for s in specs:
            if not s.shape:
                return f"{kind} {s.name!r} has no known rank >= 1"
            if isinstance(s.shape[0], int):
                return f"{kind} {s.name!r} has a static first dim {s.shape[0]}"
            if kind == "input":
                symbols.add(s.shape[0])
    if len(symbols - {None}) > 1:
        return f"the inputs' first dims are different symbols {sorted(symbols - {None})}"
    return None


def choose_policy(
    model: Any, mode: str = "auto", max_batch: int | None = None, max_wait_us: int | None = None
) -> BatchPolicy:
    """The batching policy for ``model``: ``mode`` "auto" asks the cost model, "on" batches
    whenever there is a batch dimension, "off" never; limits default to
    DEFAULT_MAX_BATCH / DEFAULT_MAX_WAIT_US."""
    if mode not in MODES:
        raise ValueError(f"batching must be one of {MODES}, got {mode!r}")
    mb = DEFAULT_MAX_BATCH if max_batch is None else int(max_batch)
    mw = DEFAULT_MAX_WAIT_US if max_wait_us is None else int(max_wait_us)
    if mb < 1 or mw < 0:
        raise ValueError(f"max_batch must be >= 1 and max_wait_us >= 0, got {mb}, {mw}")
    if mode == "off":
        return BatchPolicy(False, mb, mw, "off: requested")
    problem = batch_dim_problem(model)
    if problem is not None:
        return BatchPolicy(False, mb, mw, f"off: no batch dimension ({problem})")
    if mb == 1:
        return BatchPolicy(False, mb, mw, "off: max_batch is 1")
    flops = per_row_flops(model)
    if mode == "on":
        return BatchPolicy(True, mb, mw, f"on: requested ({flops / 1e6:.2f} MFLOP per row)")
    if flops < BATCH_MIN_FLOPS:
        why = (
            f"off: {flops / 1e6:.2f} MFLOP per row is below {BATCH_MIN_FLOPS / 1e6:.1f}; "
            "a call costs less than its request"
        )
        return BatchPolicy(False, mb, mw, why)
    return BatchPolicy(True, mb, mw, f"on: {flops / 1e6:.2f} MFLOP per row with a batch dim")


@record(frozen=True)
class BatchInfo:
    """What a call of ``run`` carries (``MicroBatcher(..., with_info=True)``): when each of
    its requests was submitted (the loop's clock), their highest priority (lowest level)
    and their rows (before padding)."""

    arrivals: tuple[float, ...]
    level: int
    rows: int


class _Item:
    __slots__ = ("arrays", "fut", "key", "level", "rows", "seq", "t")

    def __init__(
        self, arrays: Sequence[np.ndarray], fut: asyncio.Future[Any], t: float, level: int, seq: int
    ) -> None:
        self.arrays = arrays
        self.rows = int(arrays[0].shape[0])
        self.key = tuple((a.shape[1:], a.dtype.str) for a in arrays)
        self.fut = fut
        self.t = t
        self.level = level
        self.seq = seq


class MicroBatcher:
    """Gathers concurrent ``submit`` calls into calls of ``run`` on stacked rows.

    ``run`` takes and returns name -> array dicts; ``names`` are the model's inputs in
    order. ``submit`` takes one request's validated arrays (input order, first dim the
    rows) and returns that request's outputs (row slices of the batch's outputs). Requests
    are stacked only with requests of the same trailing shapes and dtypes. Bound to the
    event loop of its first ``submit``; not thread-safe (one loop serves it). It makes one
    call of ``run`` at a time. With ``with_info`` it calls ``run(feeds, BatchInfo)``.
    Counters: ``batches`` (calls of ``run`` made for more than one request),
    ``batched_requests``, and ``queued`` (requests waiting for a batch now).
    """

    def __init__(
        self,
        run: RunFn,
        names: Sequence[str],
        max_batch: int,
        max_wait_us: int,
        *,
        with_info: bool = False,
    ):
        self._run = run
        self._names = list(names)
        self.max_batch = max_batch
        self._max_wait = max_wait_us / 1e6
        self._with_info = with_info
        self._queue: list[_Item] = []
        self._queued_rows = 0
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self.batches = 0
        self.batched_requests = 0

    @property
    def queued(self) -> int:
        """Requests waiting for a batch now (those whose client left included, until the
        next batch is taken)."""
        return len(self._queue)

    def _call(self, feeds: dict[str, np.ndarray], items: Sequence[_Item]) -> Any:
        if not self._with_info:
            return self._run(feeds)
        info = BatchInfo(
            tuple(it.t for it in items), min(it.level for it in items), sum(it.rows for it in items)
        )
        return self._run(feeds, info)

    async def submit(
        self, arrays: Sequence[np.ndarray], level: int = DEFAULT_PRIORITY
    ) -> dict[str, np.ndarray]:
        """This request's outputs; ``level``: its priority level (lower goes first)."""
        loop = asyncio.get_running_loop()
        self._seq += 1
        item = _Item(arrays, loop.create_future(), loop.time(), level, self._seq)
        if item.rows >= self.max_batch:
            result: dict[str, np.ndarray] = await self._call(dict(zip(self._names, arrays)), [item])
            return result
        self._queue.append(item)
        self._queued_rows += item.rows
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())
        elif self._queued_rows >= self.max_batch and self._wake is not None:
            _resolve(self._wake)
        result = await item.fut
        return result

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        batch: list[_Item] = []
        try:
            while self._queue:
                deadline = self._queue[0].t + self._max_wait
                while self._queued_rows < self.max_batch:
                    delay = deadline - loop.time()
                    if delay <= 0:
                        break
                    self._wake = wake = loop.create_future()
                    timer = loop.call_later(delay, _resolve, wake)
                    await wake
                    timer.cancel()
                self._wake = None
                batch = self._take()
                await self._run_batch(batch)
        finally:  # cancelled (server shutdown) or a bug: nobody may wait forever
            for it in [*batch, *self._queue]:
                if not it.fut.done():
                    it.fut.set_exception(RuntimeError("the micro-batcher stopped"))

    def _take(self) -> list[_Item]:
        """The next batch: in (priority level, arrival) order, queued items with the first
        live item's key, up to max_batch rows; the rest stay queued in arrival order."""
        batch: list[_Item] = []
        rest: list[_Item] = []
        key, rows = None, 0
        for it in sorted(self._queue, key=lambda it: (it.level, it.seq)):
            if it.fut.done():  # its request was cancelled (client gone)
                self._queued_rows -= it.rows
            elif key is None or (it.key == key and rows + it.rows <= self.max_batch):
                key = it.key
                rows += it.rows
                self._queued_rows -= it.rows
                batch.append(it)
            else:
                rest.append(it)
        self._queue = sorted(rest, key=lambda it: it.seq)
        return batch

    def bucket(self, rows: int) -> int:
        """The batch size ``rows`` is padded to: the next power of two, at most max_batch."""
        size = 1
        while size < rows:
            size *= 2
        return min(size, self.max_batch) if rows <= self.max_batch else rows

    async def _run_batch(self, batch: list[_Item]) -> None:
        if not batch:
            return
        total = sum(it.rows for it in batch)
        size = self.bucket(total)
        feeds = {
            name: _stack([it.arrays[i] for it in batch], size - total)
            for i, name in enumerate(self._names)
        }
        try:
            out = await self._call(feeds, batch)
            for name, v in out.items():
                if not isinstance(v, np.ndarray) or v.ndim == 0 or v.shape[0] != size:
                    raise ValueError(f"output {name!r} does not have {size} rows")
        except TimeoutError as e:  # past the deadline: no re-runs
            for it in batch:
                _fail(it, e)
            return
        except Exception as e:  # noqa: BLE001 - each request gets its own answer or error
            if len(batch) == 1:
                _fail(batch[0], e)
            else:
                for it in batch:
                    await self._run_one(it)
            return
        if len(batch) > 1:
            self.batches += 1
            self.batched_requests += len(batch)
        start = 0
        for it in batch:
            stop = start + it.rows
            if not it.fut.done():
                it.fut.set_result({k: v[start:stop] for k, v in out.items()})
            start = stop

    async def _run_one(self, it: _Item) -> None:
        try:
            out = await self._call(dict(zip(self._names, it.arrays)), [it])
        except Exception as e:  # noqa: BLE001 - delivered to the request it belongs to
            _fail(it, e)
        else:
            if not it.fut.done():
                it.fut.set_result(out)


def _stack(parts: list[np.ndarray], pad: int) -> np.ndarray:
    """The parts stacked on dim 0, plus ``pad`` copies of the last row."""
    if pad:
        parts = [*parts, np.repeat(parts[-1][-1:], pad, axis=0)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _fail(it: _Item, e: BaseException) -> None:
    if not it.fut.done():
        it.fut.set_exception(e)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
