"""Calling one model from several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["threads_disagreeing"]


def threads_disagreeing(
    run: Callable[[np.ndarray], np.ndarray],
    xs: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    calls: int,
) -> list[str]:
    """One thread per input: thread ``i`` calls ``run(xs[i])`` ``calls`` times and stops at
    the first answer not equal to ``expected[i]``. The threads that saw one ([] if none)."""
    errors: list[str] = []

    def worker(i: int) -> None:
        for _ in range(calls):
            if not np.array_equal(run(xs[i]), expected[i]):
                errors.append(f"thread {i} disagreed")
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
