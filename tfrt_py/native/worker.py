"""The process-wide native compile worker, and what ``fork()`` does to it.

``submit(job)`` queues a tier (anything with ``state`` and ``_compile()`` / ``_fail()``)
for one daemon thread that compiles FIFO, so loads never wait and at most one core
compiles; a job whose model was dropped is skipped (the queue holds weak references).
``compile_now(job)`` compiles on the caller's thread (``native="eager"``). Every compile
holds ``_compiling``.

Fork: a thread that was compiling does not exist in the child, yet the locks it held
(numba's compiler lock among them) stay held there, so the child could never compile
again. So ``fork()`` first waits (up to ``FORK_WAIT_S``) for a running compile to finish
and holds ``_compiling`` across the fork; the child then gets a fresh queue, lock and
worker, and requeues every job still waiting to be compiled, in order. If the wait timed
out, the child cannot compile safely: its waiting jobs fail with that reason (their
models keep serving on the sync interpreter) and so do later ones.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import weakref
from typing import Any

__all__ = ["FORK_WAIT_S", "compile_now", "submit"]

#: How long ``fork()`` waits for a running native compile to finish.
FORK_WAIT_S = 60.0

_start_lock = threading.Lock()
_compiling = threading.Lock()
_jobs: queue.SimpleQueue[tuple[int, weakref.ref[Any]]] = queue.SimpleQueue()
_worker: threading.Thread | None = None
#: Submitted jobs not yet compiled, in submission order (weak: dropped models vanish).
_pending: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_ids = itertools.count()
_fork_clean = False
#: Set in a child forked while a compile ran: why nothing can compile in this process.
_broken: str | None = None


def _work(jobs: queue.SimpleQueue[tuple[int, weakref.ref[Any]]]) -> None:
    while True:
        key, ref = jobs.get()
        job = ref()
        if job is not None:
            compile_now(job)
            del job
        _pending.pop(key, None)


def submit(job: Any) -> None:
    """Queue ``job`` for the background worker (started on first use)."""
    global _worker
    key = next(_ids)
    _pending[key] = job
    with _start_lock:
        if _worker is None:
            _worker = threading.Thread(
                target=_work, args=(_jobs,), name="tfrt_py-native-compile", daemon=True
            )
            _worker.start()
    _jobs.put((key, weakref.ref(job)))


def compile_now(job: Any) -> None:
    """Compile ``job`` on this thread (unless it is no longer waiting)."""
    with _compiling:
        if job.state != "compiling":
            return
        if _broken is not None:
            job._fail(_broken)
            return
        job._compile()


def _before_fork() -> None:
    global _fork_clean
    _fork_clean = _compiling.acquire(timeout=FORK_WAIT_S)


def _after_fork_parent() -> None:
    if _fork_clean:
        _compiling.release()


def _after_fork_child() -> None:
    global _start_lock, _compiling, _jobs, _worker, _broken
    _start_lock, _compiling = threading.Lock(), threading.Lock()
    _jobs, _worker = queue.SimpleQueue(), None
    waiting = [job for job in list(_pending.values()) if job.state == "compiling"]
    _pending.clear()
    if not _fork_clean:
        _broken = (
            f"forked while a native compile was running (it did not finish within "
            f"{FORK_WAIT_S:.0f} s): numba cannot compile in this process"
        )
        for job in waiting:
            job._fail(_broken)
        return
    for job in waiting:
        submit(job)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_parent,
        after_in_child=_after_fork_child,
    )
