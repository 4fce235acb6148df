"""The compiled kernels held back while a cold process warms them in the background.

A fresh process pays ~1-2 s before its first compiled kernel runs: importing numba,
llvmlite and SciPy's BLAS, initializing numba's CPU target, reading each kernel's machine
code from numba's disk cache and building the packed gemm with LLVM. ``load()`` in such a
process (``tfrt_py.cold_start``) does not wait for that: it ``hold()``s the compiled
kernels, builds the model on the kernels' NumPy paths (the same values) and hands the
warm-up to the background worker, which ``release()``s them once it has rebuilt the model
on the compiled kernels.

While held, ``held()`` is True on every thread but the one inside ``warming()``: there
``jit.Jitted.get()`` answers None, the packed gemm reports itself unavailable and
``native_threads.ready()`` False, so nothing on a caller's thread imports numba or waits
for LLVM. ``release()`` is for good (a process holds at most once at a time; a later cold
load can hold again only before anything was warmed, which ``cold_start`` decides).

Any thread; ``held()`` is a module flag read without a lock (hot paths ask it per call).
Imports nothing of tfrt_py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["after_release", "held", "hold", "release", "warming"]

_held = False
_local = threading.local()
_lock = threading.Lock()
_after: list[Callable[[], None]] = []


def held() -> bool:
    """Whether this thread must take NumPy paths instead of compiled kernels now."""
    return _held and not getattr(_local, "warming", False)


def hold() -> None:
    """Hold the compiled kernels back on every thread but the warming one."""
    global _held
    _held = True


def release() -> None:
    """Let every thread use the compiled kernels again, then run what waited for it
    (``after_release``), on this thread."""
    global _held
    with _lock:
        _held = False
        waiting = list(_after)
        _after.clear()
    for fn in waiting:
        fn()


def after_release(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the kernels are released: now when they are not held, else on the
    thread that releases them (the native tier queues its compile there, so the warm-up
    runs first and the compile uses the compiled kernels)."""
    with _lock:
        if _held:
            _after.append(fn)
            return
    fn()


@contextmanager
def warming() -> Iterator[None]:
    """Inside: this thread warms the compiled kernels, so ``held()`` is False for it."""
    _local.warming = True
    try:
        yield
    finally:
        _local.warming = False
