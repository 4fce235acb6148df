"""Background Python work that steps aside while calls run.

Two kinds of work run Python on a background thread of the serving process: a cold
start's warm-up (``tfrt_py.cold_start``: numba imported, the model rebuilt on compiled
kernels) and the native tier's lowering of a box or signature and the loading of its
machine code (phases 1 and 3 of ``native/runtime/worker.py``'s jobs: about a second of
Python a box). A call on the serving thread releases the GIL around each BLAS product or
compiled kernel; the background thread takes it then, and the call waits for a whole
switch interval (5 ms) to get it back, every time. BERT-2L at a random batch of 1..8 and
length of 8..128 ran at 3-4x onnxruntime's time for the second each box was lowered
(2-core Zen 5), and 100-200 ms calls appeared.

So such work runs inside ``background()``, ``Yielder.tracing()`` (a trace function on that
thread only, ``sys.settrace``): at each Python function call it makes, the background
thread waits while calls are in flight (``PAUSE_MAX_S`` at a time), as long as it has had
``MIN_SHARE`` of the wall time since it began; it does not yield to calls of
``SHORT_CALL_S`` or more (smoothed), which lose little to it, nor (a box's phases) to calls
under ``MIN_CALL_S``, which lose more to the pausing. The warm-up also shortens the GIL
switch interval (``short_switches()``) against its import storms. Calls tell it they run with
``in_call()`` -- ``Model.run`` does while ``BACKGROUND[0]`` (the number of background
Python phases running, which ``background()`` maintains) is non-zero or the model is on a
cold start's stand-in; otherwise its fast path reads that one list item and nothing more.

Thread-safe: counters under ``_calls_lock``; ``BACKGROUND`` is written under it too and read
without it (a stale read costs one call a yield or one background step a pause).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

__all__ = [
    "BACKGROUND",
    "MIN_CALL_S",
    "MIN_SHARE",
    "PAUSE_MAX_S",
    "SHORT_CALL_S",
    "WARM_SWITCH_S",
    "Yielder",
    "background",
    "call_s",
    "in_call",
    "seed_call_s",
    "short_switches",
]

#: The least share of the wall time since a background phase began that it keeps.
MIN_SHARE = 0.5
#: The longest a background thread waits at once for the calls in flight to end.
PAUSE_MAX_S = 0.02
#: Background work yields only to calls shorter than this (the recent calls' smoothed
#: time): a call of tens of milliseconds loses little to it, while a stand-in's NumPy
#: paths can be many times slower than the compiled kernels a warm-up brings (MobileNetV2
#: at batch 1..32: the first 10 s went from 2.6x to 4.8x onnxruntime's time when the
#: warm-up yielded to them).
SHORT_CALL_S = 0.03
#: ... and, for a native tier's phases, only to calls of at least this long (smoothed): a
#: 75 µs native call lost more to the wake-ups of a thread pausing for it than to the GIL
#: (BERT 1x16 while 1x24 compiled: p99 2.0x of before with every call yielded to, 1.07x
#: without these).
MIN_CALL_S = 0.0003
#: The GIL switch interval during a cold start's warm-up (seconds; CPython's default is
#: 0.005). Not for a box's lowering, where it only added forced switches (BERT-2L at batch
#: 1..8, its first 10 s: 1.15x onnxruntime's time with it, 0.91x without).
WARM_SWITCH_S = 0.0002

#: Background Python phases running now (``background()``); ``Model.run`` reads item 0.
BACKGROUND = [0]

_calls = 0
_no_calls = threading.Event()
_no_calls.set()
_calls_lock = threading.Lock()
_call_s = 0.0


def call_s() -> float:
    """The recent calls' smoothed time, seconds."""
    return _call_s


def seed_call_s(est_s: float) -> None:
    """Raise the smoothed call time to a cost model's estimate (a model known to be dear
    gets no yielding from its first call)."""
    global _call_s
    with _calls_lock:
        _call_s = max(_call_s, est_s)


@contextmanager
def in_call() -> Iterator[None]:
    """Around a call that background Python should step aside for. Any thread."""
    global _calls, _call_s
    with _calls_lock:
        _calls += 1
        _no_calls.clear()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        with _calls_lock:
            _call_s = 0.5 * (_call_s + time.perf_counter() - t0)
            _calls -= 1
            if not _calls:
                _no_calls.set()


@contextmanager
def short_switches() -> Iterator[None]:
    """A shorter GIL switch interval while background Python runs. Importing numba and
    reading kernel caches is thousands of small file operations, each releasing the GIL:
    a thread calling the model back to back then takes it and keeps it for a whole
    interval (5 ms) every time (a warm-up took 8 s instead of ~1 s under such load).
    Process-wide; the interval before is restored when the last such block ends."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, WARM_SWITCH_S))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@contextmanager
def background(yielder: Yielder | None = None, short: bool = False) -> Iterator[Yielder]:
    """Around a background thread's Python phase: calls tell it they run (``BACKGROUND``)
    and ``yielder``'s tracing is on (default: a new one that does not yield to calls under
    ``MIN_CALL_S``); ``short``: the switch interval is short too (``short_switches``)."""
    with _calls_lock:
        BACKGROUND[0] += 1
    y = Yielder(min_call_s=MIN_CALL_S) if yielder is None else yielder
    try:
        with short_switches() if short else nullcontext(), y.tracing():
            yield y
    finally:
        with _calls_lock:
            BACKGROUND[0] -= 1


class Yielder:
    """Pauses a background thread while calls run: ``tracing()`` installs ``trace`` as that
    thread's trace function (this thread only, not over a tracer already there, such as
    a debugger's or coverage's), which at every Python function call waits for the calls
    in flight to end (``PAUSE_MAX_S`` at a time) as long as the thread has had
    ``MIN_SHARE`` of the wall time since it began, unless the calls (smoothed) are
    shorter than ``min_call_s``. Calls of ``SHORT_CALL_S`` or more (smoothed) and
    ``stop()`` (someone waits for the work) end the yielding and the trace; ``paused``
    sums the waits."""

    def __init__(self, min_call_s: float = 0.0) -> None:
        self.paused = 0.0
        self._t0 = 0.0
        self._min_call_s = min_call_s
        #: set by ``stop`` (any thread): the trace removes itself at the next call event
        self._stopped = False

    def stop(self) -> None:
        """End the yielding (someone waits for the work); the trace goes at the thread's
        next Python function call. Any thread."""
        self._stopped = True

    @contextmanager
    def tracing(self) -> Iterator[None]:
        """Yield to calls inside this block (the background thread's steps)."""
        if self._stopped or sys.gettrace() is not None:
            yield
            return
        if not self._t0:
            self._t0 = time.perf_counter()
        sys.settrace(self.trace)
        try:
            yield
        finally:
            sys.settrace(None)

    def trace(self, frame: Any, event: str, arg: Any) -> None:
        """The trace function: a call event of the background thread (kept cheap: it runs
        at every Python function call there)."""
        if _calls or self._stopped:
            self._pause()

    def _pause(self) -> None:
        if self._stopped or _call_s >= SHORT_CALL_S:  # no more tracing
            sys.settrace(None)
            return
        if _call_s < self._min_call_s:
            return
        now = time.perf_counter()
        budget = (1.0 - MIN_SHARE) * (now - self._t0) - self.paused
        if budget > 0.0:
            _no_calls.wait(min(budget, PAUSE_MAX_S))
            self.paused += time.perf_counter() - now


def _after_fork_child() -> None:
    """A child forked mid-call gets a fresh lock and no calls in flight."""
    global _calls_lock, _calls, _call_s
    _calls_lock = threading.Lock()
    _calls = 0
    _call_s = 0.0
    BACKGROUND[0] = 0
    _no_calls.set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)
