"""What it costs to hand work to another thread and hear back: measured once per process.

``hop_us()`` times round trips between this thread and a helper thread through two
queues (two thread wake-ups, as an offloaded call pays: the worker waking for the work,
then the caller -- or its event loop -- waking for the result) and returns the median in
µs. ``run_async`` compares a call's estimated cost with it to decide whether to run the
call inline on the loop or on a worker. Thread-safe; the first caller measures (~1 ms).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time

__all__ = ["hop_us"]

_ROUND_TRIPS = 31
_measured: float | None = None
_lock = threading.Lock()


def hop_us() -> float:
    """The median µs of a thread round trip on this machine (measured on first use)."""
    global _measured
    if _measured is None:
        with _lock:
            if _measured is None:
                _measured = _measure()
    return _measured


def _measure() -> float:
    to_helper: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[float] = queue.SimpleQueue()

    def helper() -> None:
        while (item := to_helper.get()) is not None:
            back.put(item)

    t = threading.Thread(target=helper, name="tfrt_py-hop-probe", daemon=True)
    t.start()
    samples = []
    for _ in range(_ROUND_TRIPS):
        t0 = time.perf_counter()
        to_helper.put(t0)
        back.get()
        samples.append((time.perf_counter() - t0) * 1e6)
    to_helper.put(None)
    t.join()
    return statistics.median(samples)
