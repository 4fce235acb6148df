"""A FIFO limiter on calls in flight, for threads and for asyncio, uvloop and trio tasks.

``Limiter(n)``: at most ``n`` holders at once. ``acquire()`` blocks a thread;
``await acquire_async()`` waits on an AsyncValue (so it works on any loop, and across
loops and threads at once). Waiters are served first come, first served; a waiter whose
task is cancelled (or whose wait times out) leaves the queue, and a grant that reached it
too late is passed on to the next. Every grant is released with ``release()``.

Thread-safe: one lock guards the count and the queue; grants are set under it (an
AsyncValue's callbacks only schedule a wake-up on the waiter's loop, they never call back
into the limiter).
"""

from __future__ import annotations

import collections
import threading

from .async_value import AsyncValue

__all__ = ["Limiter"]


class Limiter:
    """At most ``limit`` holders at once; FIFO waiters (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"the concurrency limit must be a positive int, got {limit!r}")
        self.limit = limit
        self._held = 0
        self._waiters: collections.deque[AsyncValue[bool]] = collections.deque()
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Grants held now."""
        return self._held

    @property
    def waiting(self) -> int:
        """Callers waiting for a grant now."""
        return len(self._waiters)

    def _enter(self) -> AsyncValue[bool] | None:
        """A grant now (None), or the caller's place in the queue."""
        with self._lock:
            if self._grant_locked():
                return None
            w: AsyncValue[bool] = AsyncValue()
            self._waiters.append(w)
            return w

    def _leave(self, w: AsyncValue[bool]) -> None:
        """The waiter ``w`` gave up: out of the queue, or its grant passed on."""
        with self._lock:
            try:
                self._waiters.remove(w)
                return
            except ValueError:
                pass  # already granted
            self._release_locked()

    def try_acquire(self) -> bool:
        """A grant now if one is free and nobody waits (True), else nothing (False)."""
        with self._lock:
            return self._grant_locked()

    def _grant_locked(self) -> bool:
        """Under the lock: take a free grant if nobody waits for one."""
        if self._held < self.limit and not self._waiters:
            self._held += 1
            return True
        return False

    def acquire(self, timeout: float | None = None) -> bool:
        """Block until granted (True) or ``timeout`` seconds pass (False)."""
        w = self._enter()
        if w is None:
            return True
        try:
            w.wait(timeout)
        except TimeoutError:
            self._leave(w)
            return False
        except BaseException:
            self._leave(w)
            raise
        return True

    async def acquire_async(self) -> None:
        """Wait for a grant; cancellable (the place in the queue is given up)."""
        w = self._enter()
        if w is None:
            return
        try:
            await w
        except BaseException:
            self._leave(w)
            raise

    def release(self) -> None:
        """Give a grant back: to the first waiter, or to the pool of free grants."""
        with self._lock:
            self._release_locked()

    def _release_locked(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.is_available():
                w.set(True)  # the grant moves to w; the count stays
                return
        self._held -= 1

    def __repr__(self) -> str:
        return f"<Limiter {self._held}/{self.limit} in flight, {len(self._waiters)} waiting>"
