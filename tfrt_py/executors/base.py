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
* ``run_async(feeds, call)``: awaitable from asyncio, uvloop or trio. The default here runs
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
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..calls import CallCancelled, CallContext
from ..concurrency import AsyncValue, HostContext, default_host

__all__ = ["Executor", "InlinePolicy", "offload"]


class InlinePolicy:
    """Whether ``run_async`` runs a call inline on the loop's thread: when its estimated
    cost is below a hop to a worker and back (``concurrency.hop_us``, measured on this
    machine). ``base_us`` is the cost model's estimate with every symbolic dim 1; with
    symbolic input dims a call's estimate scales with its largest feed (elements over the
    input's static size), so a big batch of a small model is offloaded too. Immutable."""

    __slots__ = ("_always", "_units", "base_us", "hop", "opaque")

    def __init__(self, base_us: float, hop: float, inputs: Sequence[Any], opaque: str = "") -> None:
        self.base_us = base_us
        self.hop = hop
        #: why the cost cannot be estimated (a Loop's trip count, a custom kernel): then
        #: every call is offloaded
        self.opaque = opaque
        self._units: list[tuple[str, float]] = []
        dynamic = False
        for v in inputs:
            shape = getattr(v.type, "shape", None)
            if shape is None or any(not isinstance(d, int) for d in shape):
                dynamic = True
                dims = [d if isinstance(d, int) else 1 for d in shape or ()]
                self._units.append((v.name, float(max(1, math.prod(dims)))))
        self._always: bool | None = None if dynamic else base_us < hop
        if opaque:
            self._always = False

    def inline(self, feeds: Mapping[str, Any]) -> bool:
        """Whether this call runs inline (a few attribute reads for static models)."""
        if self._always is not None:
            return self._always
        scale = 1.0
        for name, unit in self._units:
            size = getattr(feeds.get(name), "size", 1)
            scale = max(scale, size / unit)
        return self.base_us * scale < self.hop

    def describe(self) -> str:
        if self.opaque:
            return f"run_async: on a worker, the loop stays free (cost unknown: {self.opaque})"
        est = f"est. {self.base_us:,.0f} µs per call"
        if self._always is None:
            return (
                f"run_async: inline when the call's estimate ({est} per unit of the "
                f"dynamic dims) is below the {self.hop:.0f} µs hop, else on a worker"
            )
        if self._always:
            return f"run_async: inline on the loop ({est} < {self.hop:.0f} µs hop to a worker)"
        return f"run_async: on a worker, the loop stays free ({est} >= {self.hop:.0f} µs hop)"


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
        self, feeds: Mapping[str, Any], call: CallContext | None = None
    ) -> dict[str, Any]:
        """Inline when the call is cheaper than a hop (``inline``), else offloaded."""
        policy = self.inline
        if policy is None or policy.inline(feeds):
            return self.run(feeds) if call is None else self.run_call(feeds, None, call)
        return await offload(self.host or default_host(), self.run_call, feeds, call)

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


async def offload(
    host: HostContext, fn: Any, feeds: Mapping[str, Any], call: CallContext | None
) -> dict[str, Any]:
    """``fn(feeds, None, call)`` on one of ``host``'s workers, awaited on this loop.

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
            result = fn(feeds, None, call)
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
