"""The process-wide native compile worker: what runs where, at exit and across ``fork()``.

``submit(job)`` queues a tier's job (anything with ``state``, ``_prepare()``, ``source()``,
``_compile()`` and ``_fail()``) for one daemon thread that works FIFO, so loads never wait
and at most one compile runs at a time; a job whose model was dropped is skipped (the
queue holds weak references). A job runs in three phases:

1. ``_prepare()`` in this process: lowering a signature's module (Python; it may run
   jitted kernels on probe feeds);
2. the compile itself in the compile server's child process (``compile_server.py``), so
   the seconds numba spends compiling hold no lock and no GIL of this process; skipped
   when the server is unusable (``$TFRT_PY_COMPILE_SERVER=0``, or it could not start:
   the job then compiles in phase 3);
3. ``_compile()`` in this process: the machine code loaded from the disk cache the child
   filled (tens of milliseconds), and the tier switched.

A job with ``in_process = True`` (``tfrt_py.cold_start``'s warm-up) skips phase 2; one with
``not_before`` starts no earlier (waiting with no lock held: an exit does not wait for it).
``compile_now(job)`` runs phases 1 and 3 on the caller's thread (``native="eager"``).
Phases 1 and 3 hold ``_compiling``: they are the only times this process runs LLVM for a
compile. On the worker thread they run inside ``concurrency.call_yield.background()``:
they step aside at their Python function calls while calls run (a second of lowering
otherwise made every call wait 5 ms for the GIL after each product it released it for).

Exit: an ``atexit`` handler closes the server (its child is killed; a phase 2 in flight
fails), then takes ``_compiling`` -- waiting for a phase 1 or 3 in flight to finish --
and marks the worker closed: no compile starts after it. Without this, the interpreter's
exit destroyed LLVM's globals while the daemon thread was inside LLVM (an abort or a
segfault at the end of any script, test or server that exited mid-compile).

Fork: a thread running phase 1 or 3 does not exist in the child, yet the locks it held
(numba's compiler lock among them) stay held there, so ``fork()`` first waits (up to
``FORK_WAIT_S``) for ``_compiling`` and holds it across the fork. The child gets a fresh
queue, lock, worker and server (the parent's child process stays the parent's), and
requeues every job still waiting, the one the parent's server was compiling included. If
the wait timed out, the child cannot compile safely: its waiting jobs fail with that
reason (their models keep serving on the sync interpreter) and so do later ones.
"""

from __future__ import annotations

import atexit
import itertools
import os
import queue
import threading
import time
import weakref
from typing import Any

from ...concurrency import call_yield, compiled_gate
from .compile_server import CompileServer, ServerGone

__all__ = ["FORK_WAIT_S", "SERVER_ENV", "closing", "compile_now", "server", "submit", "wake"]

#: How long ``fork()`` waits for a running native compile to finish.
FORK_WAIT_S = 60.0
#: ``$TFRT_PY_COMPILE_SERVER=0``: background compiles run on the worker thread, in process.
SERVER_ENV = "TFRT_PY_COMPILE_SERVER"

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
#: Set at exit: no compile starts any more.
_closed: str | None = None
_server = CompileServer()
_wake = threading.Event()


def server() -> CompileServer:
    """This process's compile server (for ``describe()`` and tests)."""
    return _server


def _work(jobs: queue.SimpleQueue[tuple[int, weakref.ref[Any]]]) -> None:
    while True:
        key, ref = jobs.get()
        job = ref()
        if job is not None:
            _await_start(job)
            _run(job)
            del job
        _pending.pop(key, None)


def _await_start(job: Any) -> None:
    """A job with ``not_before`` (a ``time.monotonic()`` value, read again after each
    wake-up) starts no earlier, waiting without any lock held, so an exit meanwhile does
    not wait for it; ``wake()`` and the exit end the wait early."""
    while _closed is None:
        left = getattr(job, "not_before", 0.0) - time.monotonic()
        if left <= 0:
            return
        _wake.wait(left)
        _wake.clear()


def wake() -> None:
    """Make a waiting job look at its ``not_before`` again (it was moved earlier)."""
    _wake.set()


def _run(job: Any) -> None:
    """The three phases of a background job (see the module docstring), on the worker
    thread, which may use the compiled kernels while a cold process holds them back from
    callers (``compiled_gate.warming``)."""
    with compiled_gate.warming():
        _phases(job)


def _phases(job: Any) -> None:
    if getattr(job, "in_process", False):
        compile_now(job)  # the cold start's warm-up: it yields to calls itself
        return
    if os.environ.get(SERVER_ENV) == "0" or not _server.usable():
        with call_yield.background():
            compile_now(job)
        return
    with _compiling:
        if not _startable(job):
            return
        with call_yield.background():
            if not job._prepare():
                return
    try:
        job.server_seconds = _server.compile(job.source())
    except ServerGone as e:
        if _closed is None and _server.disabled:
            with call_yield.background():
                compile_now(job)  # the server cannot start here: compile in this process
            return
        job._fail(f"the compile server stopped: {e}")
        return
    except Exception as e:  # noqa: BLE001 - numba's own error for this module
        job._fail(f"{type(e).__name__}: {e}")
        return
    with call_yield.background():
        compile_now(job)


def _startable(job: Any) -> bool:
    """Whether ``job`` may compile now (caller holds ``_compiling``); fails it if not."""
    if job.state != "compiling":
        return False
    reason = _broken or _closed
    if reason is not None:
        job._fail(reason)
        return False
    return True


def closing() -> bool:
    """Whether the process is exiting (no compile starts any more): a long job checks
    this between its steps and stops."""
    return _closed is not None


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
    """Compile ``job`` on this thread, in this process (unless it is no longer waiting);
    after a server compile this loads the machine code from the disk cache."""
    with _compiling:
        if not _startable(job):
            return
        if job._prepare():
            job._compile()


def _at_exit() -> None:
    """Stop compiling before the interpreter tears LLVM down (see the module docstring):
    no phase starts after ``_closed`` is set, and one in flight is waited for."""
    global _closed
    _closed = "the process is exiting"
    _wake.set()
    _server.close()
    with _compiling:
        pass


atexit.register(_at_exit)


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
    _server.forget()
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
