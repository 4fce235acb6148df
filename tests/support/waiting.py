"""Waiting for another thread's progress without timing it."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["until"]


def until(cond: Callable[[], bool], what: str) -> None:
    """Return once ``cond()`` holds, polled every 10 ms; AssertionError naming ``what``
    after 3000 polls (a generous upper bound on a hang)."""
    for _ in range(3000):
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")
