"""A FIFO gate over a model's weight arena, whose holder can be preempted while it is parked.

One pipeline run at a time holds the arena. Each run has a ``Lease``. ``acquire(lease)``
returns an AsyncValue that becomes available when the lease holds the gate (at once if it
is free): synchronous code ``wait()``s on it, async code awaits it, so an event loop is
never blocked and no worker thread is parked. ``release(lease)`` hands the gate to the next
waiter (its AsyncValue is set on the releasing thread); it is a no-op for a lease that does
not hold the gate.

Parking: a run that is about to leave the caller's control -- yielding a result to its
consumer, or pulling the next batches from the consumer's iterable -- ``park``s its lease
and ``unpark``s it when it continues. A parked holder never blocks anybody: when a run
waits for the gate (or is already waiting when the holder parks), the gate *preempts* the
parked holder: it calls the lease's ``on_preempt`` (which stops the holder's reads and
returns an AsyncValue available once none is in flight), then releases the gate to the
waiter. The preempted run learns it at ``unpark`` (False) and must ``acquire`` again before
it touches the arena; its state (feeds, activations, place in the window) is its own, only
the weights it had loaded are lost. So an abandoned iterator, or one whose consumer or feed
source is slow, holds nothing another caller needs (each run owns its state; the arena is
a lease). ``abandon`` is for a waiter that gives up (a cancelled task, an interrupt): it
leaves the queue, or releases the gate if it was granted meanwhile. Thread-safe.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from ..concurrency import AsyncValue

__all__ = ["Gate", "Lease"]


class Lease:
    """One run's claim on the arena. ``on_preempt`` is called (once per preemption, on the
    preempting thread, while the run is parked) to stop the run's reads; it returns an
    AsyncValue available once no read of that run is in flight."""

    __slots__ = ("on_preempt", "parked", "preempted")

    def __init__(self, on_preempt: Callable[[], AsyncValue[None]]) -> None:
        self.on_preempt = on_preempt
        self.parked = False
        #: Lost the gate while parked; cleared when it is granted the gate again.
        self.preempted = False


class Gate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: Lease | None = None
        self._waiters: collections.deque[tuple[Lease, AsyncValue[None]]] = collections.deque()

    def acquire(self, lease: Lease) -> AsyncValue[None]:
        """Available once ``lease`` holds the gate (FIFO after earlier waiters); preempts a
        parked holder."""
        av: AsyncValue[None] = AsyncValue()
        with self._lock:
            if self._holder is None:
                self._holder = lease
                lease.preempted = False
                grant, victim = True, None
            else:
                self._waiters.append((lease, av))
                grant, victim = False, self._victim()
        if grant:
            av.set(None)
        if victim is not None:
            self._evict(victim)
        return av

    def release(self, lease: Lease) -> None:
        """``lease`` gives the gate up (no-op unless it holds it): the next waiter gets it."""
        with self._lock:
            if self._holder is not lease:
                return
            nxt = self._waiters.popleft() if self._waiters else None
            self._holder = None if nxt is None else nxt[0]
            if nxt is not None:
                nxt[0].preempted = False
        if nxt is not None:
            nxt[1].set(None)

    def park(self, lease: Lease) -> None:
        """``lease``'s run leaves the caller's control: it may be preempted until ``unpark``
        (at once, if somebody is already waiting)."""
        with self._lock:
            lease.parked = True
            victim = self._victim()
        if victim is not None:
            self._evict(victim)

    def unpark(self, lease: Lease) -> bool:
        """The run continues. True: it still holds the gate; False: it was preempted and must
        ``acquire`` again (and reload its weights) before it touches the arena."""
        with self._lock:
            lease.parked = False
            return self._holder is lease and not lease.preempted

    def abandon(self, lease: Lease, av: AsyncValue[None]) -> None:
        """A waiter gives up ``av`` (from ``acquire``): leave the queue, or release the gate
        if it was granted meanwhile."""
        with self._lock:
            for item in self._waiters:
                if item[1] is av:
                    self._waiters.remove(item)
                    return
            held = self._holder is lease
        if held:
            self.release(lease)

    def _victim(self) -> Lease | None:
        """The parked holder to preempt, if somebody waits (under the lock)."""
        h = self._holder
        if h is not None and h.parked and not h.preempted and self._waiters:
            h.preempted = True
            return h
        return None

    def _evict(self, lease: Lease) -> None:
        drained = lease.on_preempt()
        drained.and_then(lambda: self.release(lease))
