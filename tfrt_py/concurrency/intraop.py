"""Intra-op parallelism: one kernel's work split into parts run by a few threads at once.

``IntraOpPool(n)`` owns ``n - 1`` helper threads; ``run(parts)`` runs the callables in
``parts`` (independent pieces of one kernel, e.g. row blocks of a matrix product) with the
calling thread taking part. Parts are claimed one at a time from a shared counter by the
caller and by helpers alike (work stealing): when a helper is slow to wake -- the machine
is busy, another kernel holds it -- the caller simply runs more parts itself, so a split
kernel is never much slower than running it whole on the caller. Helpers block on a queue
while idle: they never spin (the failure of BLAS thread pools next to a busy process).

A part must not wait for another part or take locks a part holds. The pool is separate
from ``HostContext``'s (inter-op) pool, so a kernel running on an inter-op worker may split
without deadlock. Thread-safe; imports nothing of tfrt_py.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence

__all__ = ["MAX_THREADS", "IntraOpPool"]


class _Job:
    __slots__ = ("claim", "done", "error", "left", "parts")

    def __init__(self, parts: Sequence[Callable[[], object]]) -> None:
        self.parts = parts
        self.claim = itertools.count()  # next() is atomic in CPython
        self.left = list(range(len(parts)))  # countdown tokens: pop() is atomic
        self.done = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        """Run parts until none is left to claim."""
        parts = self.parts
        n = len(parts)
        while (k := next(self.claim)) < n:
            try:
                parts[k]()
            except BaseException as e:  # noqa: BLE001 - reported to the caller
                self.error = e
            if self.left.pop() == 0:
                self.done.set()


#: The most threads that run one split here, caller included. A part is a Python call
#: that takes the GIL to start its native work, and past a few threads they queue for it:
#: on a 16-core Xeon (Emerald Rapids) without TBB, ResNet-18 at batch 1 split over this
#: pool took 56.8 ms on 1 thread, 24.8 ms on 4 and 38.7 ms on 16 (MobileNetV2: 15.7 ms on
#: 1, 30.6 ms on 16). Compiled kernels on native threads (``native_threads``) use the whole
#: budget; this pool is their fallback and the path of NumPy-level splits.
MAX_THREADS = 4


class IntraOpPool:
    """A split's parts run by the caller and at most ``MAX_THREADS - 1`` helpers (started
    on first use); ``threads`` is the budget it was made for (kernels size their native
    splits by it)."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        #: helper threads: the budget less the caller, at most MAX_THREADS - 1
        self.helpers = min(threads, MAX_THREADS) - 1
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._helpers: list[threading.Thread] = []
        self._lock = threading.Lock()
        _POOLS.add(self)

    def run(self, parts: Sequence[Callable[[], object]]) -> None:
        """Run every part (the caller runs some itself); raise the first part's error."""
        if len(parts) <= 1 or self.helpers == 0:
            for p in parts:
                p()
            return
        if not self._helpers:
            self._start()
        job = _Job(parts)
        for _ in range(min(self.helpers, len(parts) - 1)):
            self._queue.put(job)
        job.work()
        job.done.wait()
        if job.error is not None:
            raise job.error

    def _start(self) -> None:
        with self._lock:
            if self._helpers:
                return
            for i in range(self.helpers):
                t = threading.Thread(target=self._serve, name=f"tfrt_py-intraop-{i}", daemon=True)
                t.start()
                self._helpers.append(t)

    def _serve(self) -> None:
        get = self._queue.get
        while (job := get()) is not None:
            job.work()

    def _reset_after_fork(self) -> None:
        """In a forked child: the parent's helpers (and any lock they held) are gone."""
        self._queue = queue.SimpleQueue()
        self._helpers = []
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop the helpers (they finish the job they are in)."""
        with self._lock:
            for _ in self._helpers:
                self._queue.put(None)
            self._helpers = []


_POOLS: weakref.WeakSet[IntraOpPool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
