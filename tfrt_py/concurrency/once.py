"""A process-wide decision made once: which compiled path a kernel takes here, and the
machine code built for it.

``Once(decide)``: the first ``get()`` calls ``decide()`` under a lock (two threads never
build one kernel twice, nor register its symbols twice) and keeps what it returned for
the life of the process; later calls read it without the lock. ``peek()`` says what was
decided without deciding (None before). ``decide`` must not raise: it returns what the
callers fall back on. Any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Once"]

T = TypeVar("T")


class Once(Generic[T]):
    """``decide()``'s result, computed on first use (see the module docstring)."""

    __slots__ = ("_decide", "_done", "_lock")

    def __init__(self, decide: Callable[[], T]) -> None:
        self._decide = decide
        self._lock = threading.Lock()
        self._done: list[T] = []

    def get(self) -> T:
        """The decision, made now if it was not."""
        done = self._done
        if done:
            return done[0]
        with self._lock:
            if not done:
                done.append(self._decide())
            return done[0]

    def peek(self) -> T | None:
        """The decision, or None before it was made (decides nothing)."""
        done = self._done
        return done[0] if done else None
