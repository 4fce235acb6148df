"""A FIFO gate: one pipeline run at a time owns a model's weight arena.

``acquire()`` returns an AsyncValue that becomes available when the caller holds the gate
(at once if it is free): synchronous code ``wait()``s on it, async code awaits it, so an
event loop is never blocked and no worker thread is parked. ``release()`` hands the gate to
the next waiter (its AsyncValue is set on the releasing thread). ``abandon(av)`` is for a
waiter that gives up (a cancelled task): it leaves the queue, or releases the gate if it
was granted meanwhile. ``held_by_this_thread()`` lets a synchronous caller fail instead
of waiting forever for a run its own thread holds (an unfinished ``run_batches`` iterator).
Thread-safe.
"""

from __future__ import annotations

import collections
import threading

from ..concurrency import AsyncValue

__all__ = ["Gate"]


class Gate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: AsyncValue[None] | None = None
        self._waiters: collections.deque[tuple[AsyncValue[None], int]] = collections.deque()
        self._owner = 0  # the thread that acquired the current holder

    def held_by_this_thread(self) -> bool:
        with self._lock:
            return self._holder is not None and self._owner == threading.get_ident()

    def acquire(self) -> AsyncValue[None]:
        av: AsyncValue[None] = AsyncValue()
        me = threading.get_ident()
        with self._lock:
            if self._holder is None:
                self._holder, self._owner = av, me
                grant = True
            else:
                self._waiters.append((av, me))
                grant = False
        if grant:
            av.set(None)
        return av

    def release(self) -> None:
        with self._lock:
            nxt, self._owner = self._waiters.popleft() if self._waiters else (None, 0)
            self._holder = nxt
        if nxt is not None:
            nxt.set(None)

    def abandon(self, av: AsyncValue[None]) -> None:
        with self._lock:
            for item in self._waiters:
                if item[0] is av:
                    self._waiters.remove(item)
                    return
            held = self._holder is av
        if held:
            self.release()
