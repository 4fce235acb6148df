"""The one interface every executor implements, and how ``run_async`` leaves the loop.

An ``Executor`` runs one loaded model. ``Model`` (``tfrt_py.model``) is a thin facade over
exactly one: the sync interpreter, the async dataflow executor, the native tier or the
streamed program. What each must provide:

* ``run(feeds, outputs=None)``: the fast synchronous entry, on the calling thread. It may be
  an instance attribute that changes over time (the sync interpreter points it at the newest
  plan's generated code; the native tier at the compiled function once it is ready), so
  callers look it up per call.
* ``run_call(feeds, outputs, call)``: the same under a ``CallContext`` (a deadline or a
  canceller): DeadlineExceeded / CallCancelled between kernels and Loop/Scan iterations.
* ``run_async(feeds, call, outputs)``: awaitable from asyncio, uvloop or trio. The default runs
  the call inline on the loop's thread when the cost model says the whole call is cheaper
  than a hop to a worker (``InlinePolicy``), and otherwise on the host's pool, so the loop
  stays free; cancelling the awaiting task stops the worker at its next kernel or
  iteration, and a deadline wakes the awaiting task at once.
* ``describe_lines()``: its lines for ``Model.describe()``; ``memory_plan(shapes)`` where
  it plans memory (else ValueError). (The streamed executor adds ``run_batches``.)

Threading: executors are immutable after load except where stated (plans, tier-up), and
safe to call from many threads at once; each call owns its state.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..calls import CallCancelled, CallContext
from ..concurrency import AsyncValue, HostContext, default_host
from .inline_policy import InlinePolicy, offload_hop_us

__all__ = ["Executor", "offload", "yield_if_due"]


class Executor:
    """Base class of the executors (see the module docstring for the contract).

    Attributes every executor has: ``name`` ("sync" | "async" | "native" | "stream"),
    ``why`` (why it was chosen), ``inline`` (the InlinePolicy of ``run_async``; None: it
    always runs inline), ``host`` (None: ``default_host()``), ``notes`` (extra
    ``describe()`` lines). The selector sets them after construction, before any call."""

    name = "?"
    why = "requested"
    inline: InlinePolicy | None = None
    host: HostContext | None = None
    notes: tuple[str, ...] = ()
    #: ``run(feeds, outputs)`` writes an output made by ``Concat(feed, ...)`` straight into
    #: a caller's buffer that starts with that feed (only the new rows), rather than
    #: computing it apart and copying it in: generation keeps a KV cache in one buffer
    #: only on an executor that does (``generation.steps``)
    writes_concat_in_place = False
    #: "auto" left the native tier's choice to a cold start's switch (``selection``)
    native_deferred = False
    #: The cost model's µs per call, and how much inline work a loop's thread may do
    #: between two yields to its loop (see ``yield_if_due``).
    call_us = 0.0
    loop_slice_us = 1000.0

    def run(
        self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def run_call(
        self,
        feeds: Mapping[str, Any],
        outputs: Mapping[str, np.ndarray] | None,
        call: CallContext,
    ) -> dict[str, Any]:
        raise NotImplementedError

    async def run_async(
        self,
        feeds: Mapping[str, Any],
        call: CallContext | None = None,
        outputs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Inline when the call is cheaper than a hop (``inline``), else offloaded;
        ``outputs`` as ``run``'s."""
        policy = self.inline
        if policy is None:
            r = self.run(feeds, outputs) if call is None else self.run_call(feeds, outputs, call)
            await yield_if_due(self.call_us, self.loop_slice_us)
            return r
        host = self.host or default_host()
        if policy.hop is None:
            policy.hop = await offload_hop_us(host)
        scale = policy.scale(feeds)
        if policy.inline(scale):
            t0 = time.perf_counter()
            r = self.run(feeds, outputs) if call is None else self.run_call(feeds, outputs, call)
            us = (time.perf_counter() - t0) * 1e6
            policy.observe(us, scale)
            await yield_if_due(us, self.loop_slice_us)
            return r

        def timed(f: Mapping[str, Any], outputs: Any, c: CallContext) -> dict[str, Any]:
            t0 = time.perf_counter()
            r = self.run_call(f, outputs, c)
            policy.observe((time.perf_counter() - t0) * 1e6, scale)
            return r

        return await offload(host, timed, feeds, call, outputs)

    def describe_lines(self) -> list[str]:
        """This executor's ``describe()`` lines (the selector's notes and the run_async
        rule come first)."""
        return []

    def describe_policy(self) -> list[str]:
        """The notes and the run_async rule, for ``describe()``."""
        lines = [f"  {n}" for n in self.notes]
        if self.inline is not None:
            lines.append("  " + self.inline.describe())
        return lines

    def memory_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        raise ValueError(
            f"memory plans belong to the sync executor; this model runs on {self.name!r}"
        )


_slices = threading.local()


async def yield_if_due(us: float, slice_us: float) -> None:
    """Count ``us`` of inline work done on this (event loop) thread; once a slice's worth
    has accumulated, yield to the loop once. A call that completes inline never suspends
    its task, so a task awaiting many cheap calls in a row would otherwise never let the
    loop run anything else; yielding on every call would double a tiny model's latency.
    Works on asyncio, uvloop and trio (``anyio.sleep(0)``)."""
    spent = getattr(_slices, "us", 0.0) + us
    if spent < slice_us:
        _slices.us = spent
        return
    _slices.us = 0.0
    import anyio  # here: on a running loop's yield, not at ``import tfrt_py`` (~25 ms)

    await anyio.sleep(0)


async def offload(
    host: HostContext,
    fn: Any,
    feeds: Mapping[str, Any],
    call: CallContext | None,
    outputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``fn(feeds, outputs, call)`` on one of ``host``'s workers, awaited on this loop.

    The worker runs under ``call`` (made here when the caller has none, so that cancelling
    the awaiting task stops the worker at its next kernel or Loop iteration). When the call
    stops (deadline or cancel) the awaiting task wakes at once with the error, even while
    a long kernel is still running on the worker; the worker's late result is dropped."""
    own = call is None
    if call is None:
        call = CallContext()
    done: AsyncValue[dict[str, Any]] = AsyncValue()

    def work() -> None:
        try:
            result = fn(feeds, outputs, call)
        except BaseException as e:  # noqa: BLE001 - the awaiting task must hear of it
            _settle(done, None, e)
        else:
            _settle(done, result, None)

    def stopped() -> None:
        if call.reason == "deadline":
            _settle(done, None, call.deadline_error())
        else:
            _settle(done, None, CallCancelled("the call was cancelled"))

    call.on_stop(stopped)
    host.enqueue(work)
    try:
        return await done
    except BaseException:
        if not done.is_available():  # the awaiting task was cancelled: stop the worker
            call.cancel()
        raise
    finally:
        if own:
            call.finish()


def _settle(av: AsyncValue[Any], value: Any, error: BaseException | None) -> None:
    """Set ``av`` unless another thread set it first (the worker and a stop race)."""
    with contextlib.suppress(RuntimeError):
        if error is None:
            av.set(value)
        else:
            av.set_error(error)
