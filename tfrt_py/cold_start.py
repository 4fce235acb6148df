"""A fresh process's first result without waiting for numba.

The first compiled kernel of a process costs ~1-2 s: numba, llvmlite and SciPy's BLAS
imported, numba's CPU target initialized, each kernel's machine code read from numba's
disk cache, the packed gemm built by LLVM. A small model's whole load is tens of
milliseconds of that budget. So in a *cold* process -- numba installed and enabled, and
not yet imported by tfrt_py -- ``load()`` (``native="background"``, the default) builds
the model on its kernels' NumPy paths, which compute the same values, and serves it at
once; the process-wide native worker (``native/runtime/worker.py``) then warms the
compiled kernels, rebuilds each such model's program on them and, once it has released
the kernels, switches the model to it (``Model._compiled_switch``: the executor's
interpreter, or the whole executor, replaced by one attribute write; calls in flight
finish on the old one). Switching only after the release matters: a call on a switched
model while the kernels were still held on its thread planned its shapes on NumPy paths
for good (the first of two models loaded together stayed 3-4x slower).

How (``concurrency.compiled_gate``): ``building(native_mode)`` wraps a load. The first
cold load ``hold()``s the compiled kernels -- every thread but the warm-up's takes NumPy
paths, so no caller imports numba -- and when the last cold build in flight ends, one
``_Warmup`` job is queued on the worker (after the load, so it does not slow the load).
It runs in this process under the worker's compile lock (LLVM at exit: the worker's exit
handler waits for a step in flight, and the job stops between steps once the process
exits), switches every model registered by ``switch_later``, then ``release()``s the
kernels for good. A load with ``native="eager"`` waits for a warm-up in flight and builds
on the compiled kernels, as does every load once the process is warm.

The warm-up builds ``depthwise_ir``'s kernel first where a loaded model holds a
depthwise conv it serves (``depthwise_ir.WANTED``), ``activation_ir``'s where one
computes a float32 GELU, Sigmoid or SiLU, ``gemm_cols``' where one holds a one-group
conv, and ``gemm_indirect``'s where one holds a one-group conv of K 64 or more: the
stand-ins call their machine code through ctypes from then on
(``conv_depthwise_grid.raw_depthwise_fn``, ``activation_ir.gelu``/``logistic``,
``conv_cols_raw.raw_cols_fn``, ``conv_packed_raw.raw_packed_fn``), seconds before the
switch.

The warm-up yields to calls (``concurrency.call_yield``, which the native tier's
background lowering uses too; ``Model.run`` marks its calls): while a call on a stand-in
runs, the warm-up thread pauses at its next Python function call (a trace function on
that thread only), so the call is not slowed by it; the warm-up keeps at least
``MIN_SHARE`` of the wall time since it began, yields only to short calls
(``SHORT_CALL_S``), and stops yielding once someone waits for it (``hurry``). Without
it, calls in the second after a cold load took 10-45 ms instead of ~1.5 (BERT-2L on the
NumPy paths): each NumPy operation that released the GIL handed it to the warm-up.

``$TFRT_PY_COLD_START=0``: no cold builds; ``load()`` waits for the compiled kernels (the
behaviour before). ``warm_now()`` warms on the caller's thread (tests, servers that want
the compiled kernels before their first request).

Thread-safe: the state below is guarded by ``_lock``; the job runs on the worker thread.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .concurrency import call_yield, compiled_gate
from .concurrency.env_switch import switched_off
from .kernels.lib import jit
from .native.runtime import worker

__all__ = [
    "ENV_COLD_START",
    "START_DELAY_S",
    "await_switch",
    "building",
    "describe",
    "hurry",
    "switch_later",
    "wait_released",
    "warm_now",
]

#: ``TFRT_PY_COLD_START=0``: ``load()`` waits for the compiled kernels in a cold process.
ENV_COLD_START = "TFRT_PY_COLD_START"
#: The warm-up starts this long after the last cold load: a script that loads, calls and
#: exits sooner ends without waiting for it (the exit waits for a warm-up step in flight:
#: LLVM must not be torn down under it). ``Model.wait_compiled``/``warmup`` start it now.
START_DELAY_S = 0.5

_lock = threading.Lock()
#: Loads building on NumPy paths now.
_building = 0
#: (model, its switched event) waiting for the compiled kernels.
_waiting: list[tuple[weakref.ref[Any], threading.Event]] = []
_job: _Warmup | None = None
#: Set while the compiled kernels are not held.
_released = threading.Event()
_released.set()
#: What the last warm-up did, for ``describe()``.
_record: list[str] = []


def _cold() -> bool:
    """Whether the compiled kernels would make a load wait now (caller holds ``_lock``)."""
    return not switched_off(ENV_COLD_START) and not jit.imported() and jit.jit_enabled()


def _enter(native_mode: str) -> bool:
    global _building
    with _lock:
        if native_mode == "background" and (compiled_gate.held() or _cold()):
            compiled_gate.hold()
            _released.clear()
            _building += 1
            return True
    wait_released()  # an eager load (or a warm process) builds on the compiled kernels
    return False


def _leave() -> None:
    global _building, _job
    with _lock:
        _building -= 1
        if _building == 0 and _job is None:
            _job = _Warmup()
            worker.submit(_job)


@contextmanager
def building(native_mode: str) -> Iterator[bool]:
    """Around a load's build: yields whether it builds on NumPy paths (then the model
    must be given to ``switch_later`` inside the block, or it keeps them)."""
    cold = _enter(native_mode)
    try:
        yield cold
    finally:
        if cold:
            _leave()


def switch_later(model: Any) -> threading.Event:
    """Have the warm-up switch ``model`` (``model._compiled_switch()``) to the
    compiled kernels; the event is set once it did, or once it cannot."""
    done = threading.Event()
    with _lock:
        _waiting.append((weakref.ref(model), done))
    # the cost model's time for a call on the compiled kernels (dims as 1; the stand-in's
    # NumPy paths are slower still) tells a long call before one was timed: the warm-up
    # then does not yield to the model's first calls (a CNN's first stand-in call of
    # seconds gave ~1 s of the warm-up away)
    call_yield.seed_call_s(model.prepared.cost.call_us() * 1e-6)
    return done


def wait_released(timeout: float | None = None) -> bool:
    """Block until no warm-up holds the compiled kernels back (starting a waiting one
    now); False on timeout."""
    if not _released.is_set():
        hurry()
    return _released.wait(timeout)


def await_switch(switched: threading.Event | None, timeout: float | None) -> bool:
    """Wait until a model's switch (``switch_later``'s event; None: built on the compiled
    kernels) is done, starting the warm-up now; False on timeout."""
    if switched is None or switched.is_set():
        return True
    hurry()
    return switched.wait(timeout)


def hurry() -> None:
    """Start a warm-up that waits for its ``START_DELAY_S`` now, and stop it yielding to
    calls (someone waits for it)."""
    job = _job
    if job is None:
        return
    job.yielder.stop()
    if job.not_before:
        job.not_before = 0.0
        worker.wake()


def warm_now() -> None:
    """Warm the compiled kernels on this thread (numba imported, the packed gemm built);
    later loads build on them at once. Models built cold still switch in the background."""
    from .kernels.lib import gemm_packed  # here: `import tfrt_py` does not build its tables

    with compiled_gate.warming():
        jit.import_numba()
        gemm_packed.available()


def describe() -> str:
    """A line on this process's cold start, "" when it had none."""
    with _lock:
        if _building or _job is not None:
            return "cold start: NumPy paths while the compiled kernels warm in the background"
        return "; ".join(_record)


class _Warmup:
    """The worker job (``worker.py``'s protocol, run in this process): warm, switch the
    waiting models, release."""

    in_process = True

    def __init__(self) -> None:
        self.state = "compiling"
        self._t0 = time.perf_counter()
        #: when the worker may start it (``START_DELAY_S``; ``hurry`` moves it to now)
        self.not_before = time.monotonic() + START_DELAY_S
        self.yielder = call_yield.Yielder()
        #: (what switches a model to its compiled program, its switched event), built by
        #: ``_compile`` and run by ``_end`` when it releases the kernels
        self._built: list[tuple[Any, threading.Event]] = []

    def _prepare(self) -> bool:
        from .kernels.lib import activation_ir, depthwise_ir, gemm_cols, gemm_indirect, gemm_packed

        with compiled_gate.warming(), call_yield.background(self.yielder, short=True):
            jit.import_numba()
            if not worker.closing():
                gemm_packed.available()
            if depthwise_ir.WANTED.is_set() and not worker.closing():
                depthwise_ir.function()  # the stand-ins' depthwise convs take it at once,
                depthwise_ir.build_wanted()  # their kinds and epilogues
            if activation_ir.WANTED.is_set() and not worker.closing():
                activation_ir.build_once()  # and their float32 GELU, Sigmoid and SiLU
            if gemm_cols.WANTED.is_set() and not worker.closing():
                gemm_cols.available()  # and their one-group convs,
            if gemm_indirect.WANTED.is_set() and not worker.closing():
                gemm_indirect.available()  # those conv_packed serves on its kernels
        return True

    def _compile(self) -> None:
        switched, failed = 0, ""
        with compiled_gate.warming(), call_yield.background(self.yielder, short=True):
            while not worker.closing():
                with _lock:
                    batch = list(_waiting)
                    _waiting.clear()
                if not batch:
                    break
                for ref, done in batch:
                    model = ref()
                    try:
                        if model is None:
                            done.set()
                        else:  # built now, switched once the kernels are released (_end)
                            self._built.append((model._compiled_switch(), done))
                            switched += 1
                    except Exception as e:  # noqa: BLE001 - the model keeps its NumPy paths
                        failed = f"; a model kept its NumPy paths: {type(e).__name__}: {e}"
                        done.set()
                    del model
        secs = time.perf_counter() - self._t0
        paused = self.yielder.paused
        yielded = f", {paused:.2f} s of it yielded to calls" if paused >= 0.005 else ""
        self._end("ready", f"cold start: {switched} model(s) switched to the compiled "
                           f"kernels {secs:.2f} s after load{yielded}{failed}")  # fmt: skip

    def _fail(self, reason: str) -> None:
        self._end("failed", f"cold start: the compiled kernels did not warm ({reason}); "
                            "NumPy paths serve")  # fmt: skip

    def _end(self, state: str, note: str) -> None:
        """Release the kernels (under ``_lock``, so a load cannot slip in between), and
        set every waiting event: nobody waits on a job that ended."""
        global _job
        with _lock:
            self.state = state
            _record[:] = [note]
            rest = list(_waiting) if state != "ready" or worker.closing() else []
            if state != "ready" or worker.closing():
                _waiting.clear()
            # the built models switch when the kernels are released: now, or (a cold load
            # still building) at the next warm-up's release
            for install, done in self._built:
                compiled_gate.after_release(_switcher(install, done))
            unswitched = [done for _, done in self._built] if worker.closing() else []
            self._built = []
            if _building == 0:
                compiled_gate.release()
                _released.set()
            _job = None
        for _, done in rest:
            done.set()
        for done in unswitched:  # the process exits: nobody waits on a switch to come
            done.set()


def _switcher(install: Any, done: threading.Event) -> Any:
    """What ``compiled_gate.release`` runs for a built model: switch it, then tell its
    waiters. A failure leaves it on its NumPy paths and is said in ``describe()``'s line;
    nothing raises into the release (which may run under ``_lock``: no lock taken here)."""

    def switch() -> None:
        try:
            install()
        except Exception as e:  # noqa: BLE001 - the model keeps its NumPy paths
            _record.append(f"cold start: a model built on the compiled kernels could not "
                           f"switch to them and keeps its NumPy paths: "
                           f"{type(e).__name__}: {e}"[:500])  # fmt: skip
        finally:
            done.set()

    return switch


def _after_fork_child() -> None:
    """A child forked mid-load gets a fresh lock."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)
