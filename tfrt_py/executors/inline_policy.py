"""When ``run_async`` runs a call inline on the event loop's thread, and when on a worker.

A hop to a worker and back (enqueue on the host's pool, wake the loop when done) costs tens
of µs; a tiny model's call costs less, so running it inline is faster and holds the loop
for less than the hop would. A bigger call must leave the loop. ``InlinePolicy`` decides per
call: the call's cost -- the cost model's estimate at first, then a running average of
measured call times -- against the hop, measured once per process on the first
``run_async`` (``offload_hop_us``: real round trips through the host's pool and this loop).
With symbolic input dims the cost scales with the call's largest feed (elements over the
input's static size), so a big batch of a small model is offloaded. A model whose cost is
unknown at load (Loop/Scan trip counts, custom kernels) is always offloaded.

Threading: one policy per model, shared by every call. ``observe`` updates the average
without a lock (a lost update only delays the average by one sample).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..concurrency import AsyncValue, HostContext

__all__ = ["InlinePolicy", "offload_hop_us"]

_hop_us: float | None = None


async def offload_hop_us(host: HostContext) -> float:
    """The median µs of a no-op handed to ``host``'s pool and awaited on this loop (measured
    on the first call in the process, ~1 ms; later calls return the figure)."""
    global _hop_us
    if _hop_us is None:
        samples = []
        for _ in range(9):
            done: AsyncValue[None] = AsyncValue()
            t0 = time.perf_counter()
            host.enqueue(done.set, None)
            await done
            samples.append((time.perf_counter() - t0) * 1e6)
        rest = sorted(samples[1:])  # the first one may start the workers
        _hop_us = (rest[3] + rest[4]) / 2  # their median (statistics costs 3 ms to import)
    return _hop_us


class InlinePolicy:
    """The run_async rule of one model (see the module docstring). ``base_us``: the cost
    model's µs per call with every symbolic dim 1; ``opaque``: why the cost cannot be known
    at load ("": it can)."""

    __slots__ = ("_measured", "_units", "base_us", "hop", "opaque")

    def __init__(self, base_us: float, inputs: Sequence[Any], opaque: str = "") -> None:
        self.base_us = base_us
        self.opaque = opaque
        #: the offload round trip, µs (None until the first run_async measures it)
        self.hop: float | None = None
        self._measured: float | None = None  # running average, µs per unit of scale
        self._units: list[tuple[str, float]] = []
        for v in inputs:
            shape = getattr(v.type, "shape", None)
            if shape is None or any(not isinstance(d, int) for d in shape):
                dims = [d if isinstance(d, int) else 1 for d in shape or ()]
                self._units.append((v.name, float(max(1, math.prod(dims)))))

    def scale(self, feeds: Mapping[str, Any]) -> float:
        """How many times the unit call this one is (1 for a static model)."""
        s = 1.0
        for name, unit in self._units:
            s = max(s, getattr(feeds.get(name), "size", 1) / unit)
        return s

    def inline(self, scale: float) -> bool:
        """Whether a call of this scale runs inline (``hop`` must be known)."""
        if self.opaque:
            return False
        per = self._measured if self._measured is not None else self.base_us
        return per * scale < (self.hop or 0.0)

    def observe(self, us: float, scale: float) -> None:
        """A call of ``scale`` took ``us`` (without any hop)."""
        per = us / scale
        m = self._measured
        self._measured = per if m is None else 0.8 * m + 0.2 * per

    def describe(self) -> str:
        if self.opaque:
            return f"run_async: on a worker, the loop stays free (cost unknown: {self.opaque})"
        per = "" if not self._units else " per unit of the dynamic dims"
        measured = "" if self._measured is None else f", measured {self._measured:,.0f} µs"
        hop = "the hop (measured on the first run_async)" if self.hop is None else (
            f"the {self.hop:,.0f} µs hop")  # fmt: skip
        return (
            f"run_async: inline on the loop while a call (est. {self.base_us:,.0f} µs"
            f"{measured}{per}) costs less than {hop} to a worker, else on a worker"
        )
