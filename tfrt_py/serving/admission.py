"""Admission: how many calls of one model run at once, who waits next, who is turned away.

Each served model has one ``Admission``: at most ``limit`` model calls hold a slot; other
requests wait in order of (priority level, arrival) -- lower levels first, first come
first served within a level; and a request that would have to wait while ``max_queue``
requests already wait is refused at once (``overloaded``: 503 with ``Retry-After``),
before its body is decoded or the model is touched.

Why here and not only in the runtime: ``load(max_concurrency=)`` (``model.limiter``) bounds
calls too, and the server loads its models with it, but its queue is FIFO and opaque. The
server needs to know how long a request waited (the queue-time metric), how many wait (the
503 and the gauge), and to let a priority jump the queue. The admission limit is the
model's limiter's limit when it has one, so server calls never wait in the limiter: it
stays the backstop for callers of the same Model outside the server.

Which thread: the event loop's, only (``acquire``/``release`` from the loop's tasks and
callbacks); not thread-safe, and needs no lock for it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math

from .errors import RequestError
from .limits import DEFAULT_PRIORITY, MAX_PRIORITY, MAX_RETRY_AFTER_S

__all__ = ["Admission", "priority_level"]


def priority_level(priority: int | None) -> int:
    """The level a request's ``priority`` parameter puts it at: 0 or None (none named) is
    ``DEFAULT_PRIORITY``; any other value is its own level (1 is the highest)."""
    return DEFAULT_PRIORITY if not priority else int(priority)


class Admission:
    """Slots for ``limit`` concurrent calls; waiters by (level, arrival); at most
    ``max_queue`` waiters (see the module docstring). Counters: ``in_flight`` (slots held),
    ``waiting`` (requests queued)."""

    def __init__(self, limit: int, max_queue: int) -> None:
        if limit < 1 or max_queue < 0:
            raise ValueError(f"need limit >= 1 and max_queue >= 0, got {limit}, {max_queue}")
        self.limit = limit
        self.max_queue = max_queue
        self.in_flight = 0
        self.waiting = 0
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        #: Moving average of how long a slot is held (s): the Retry-After estimate.
        self._hold_s = 0.0

    @property
    def busy(self) -> bool:
        """A request arriving now would wait."""
        return self.in_flight >= self.limit or self.waiting > 0

    def overloaded(self, queued: int | None = None) -> RequestError | None:
        """The 503 for a request that would wait behind a full queue (``queued`` requests
        waiting; default: this admission's), or None when it may join."""
        waiting = self.waiting if queued is None else queued
        if not (self.in_flight >= self.limit and waiting >= self.max_queue):
            return None
        retry = self.retry_after(waiting)
        return RequestError(
            503,
            f"overloaded: {self.in_flight} call(s) running (the limit) and {waiting} "
            f"request(s) waiting (max_queue {self.max_queue}); retry in {retry} s",
            {"Retry-After": str(retry)},
        )

    def retry_after(self, waiting: int) -> int:
        """Seconds until a slot is likely free for a newcomer: the waiters ahead times the
        average hold, over the slots; within [1, MAX_RETRY_AFTER_S]."""
        est = self._hold_s * (waiting + 1) / self.limit
        return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(est))))

    async def acquire(self, level: int = DEFAULT_PRIORITY) -> None:
        """Wait for a slot (at once when free). Cancellable: a cancelled waiter leaves the
        queue, or passes on a slot it was granted meanwhile."""
        if not 0 <= level <= MAX_PRIORITY:
            raise ValueError(f"priority level {level} out of range")
        if not self.busy:
            self.in_flight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (level, next(self._seq), fut))
        self.waiting += 1
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # granted as it was cancelled: the slot goes to the next
            else:
                fut.cancel()
                self.waiting -= 1
            raise

    def release(self, held_s: float | None = None) -> None:
        """Give a slot back (held ``held_s`` seconds): to the first live waiter, or free."""
        if held_s is not None:
            self._hold_s += 0.2 * (held_s - self._hold_s)
        while self._heap:
            _, _, fut = heapq.heappop(self._heap)
            if not fut.done():
                self.waiting -= 1
                fut.set_result(None)  # the slot moves to it: in_flight stays
                return
        self.in_flight -= 1
