"""One call's deadline and cancellation: ``CallContext``, and the timer that expires it.

A call made with a timeout (``run(feeds, timeout=s)``), or offloaded from an event loop so
that its awaiting task can cancel it, carries a ``CallContext``. Nothing on the hot path
reads the clock: one process-wide daemon thread (the timer) sets ``stop`` when a deadline
passes, and ``cancel()`` sets it directly; executors read ``stop`` between kernels,
Loop/Scan between iterations, and native code reads ``flag`` (a one-element array written
with ``stop``). A call without a timeout and without a canceller has no context at all and
pays nothing.

Who reads it where: the executor running a call makes it the thread's *current* call
(``entered``) on every thread that runs the call's kernels, so a Loop kernel, which is
called with its inputs only, finds it with ``current_call()``. ``check()`` raises
``DeadlineExceeded`` (naming the node) or ``CallCancelled``; executors let both through
unwrapped, never as an ExecutionError.

Threading: ``stop``/``reason`` are written by the timer thread or the cancelling thread
and read by any thread running the call (a plain attribute: a late read costs at most one
more kernel or iteration). ``on_stop`` callbacks run on the thread that stops the call; one
that raises is logged and the others still run.

Any timeout is safe: the timer sleeps at most ``MAX_WAIT_S`` at a time (a deadline 1e300 s
away, or ``inf``, stays queued and never fires), so no value can overflow the wait and end
the timer thread -- which would leave every later deadline in the process unenforced.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import numpy as np

from .errors import DeadlineExceeded, TfrtError

__all__ = [
    "CallCancelled",
    "CallContext",
    "check_timeout",
    "current_call",
    "entered",
]

#: The longest the timer thread sleeps before looking at its heap again (seconds); far
#: below the platform's wait limit (``threading.TIMEOUT_MAX``).
MAX_WAIT_S = 3600.0


class CallCancelled(TfrtError, RuntimeError):
    """The call was cancelled (its awaiting task was cancelled); raised on the threads still
    running its kernels so they stop. The caller sees the cancellation of its own task."""


def check_timeout(timeout: Any, what: str = "timeout") -> float | None:
    """``timeout`` as a positive float, or None; ValueError otherwise."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError(f"{what} must be a number of seconds or None, got {timeout!r}")
    t = float(timeout)
    if not t > 0 or math.isnan(t):
        raise ValueError(f"{what} must be > 0 seconds, got {timeout!r}")
    return t


class CallContext:
    """A call's deadline (``timeout`` seconds from creation, None: none) and cancellation.

    ``stop`` turns True once, when the deadline passes or ``cancel()`` is called; ``reason``
    says which ("deadline" | "cancelled"). ``node`` is the name and op of the kernel a
    checker last reported (for the error message). Call ``finish()`` when the call is over so
    the timer forgets it.
    """

    __slots__ = (
        "_callbacks",
        "_entry",
        "_lock",
        "deadline",
        "flag",
        "node",
        "reason",
        "stop",
        "timeout",
    )

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = timeout
        self.deadline = math.inf if timeout is None else time.monotonic() + timeout
        self.stop = False
        self.reason = ""
        self.node: tuple[str, str] | None = None
        #: 1 once stopped: what compiled (native) code polls.
        self.flag = np.zeros(1, np.uint8)
        self._callbacks: list[Callable[[], object]] = []
        self._lock = threading.Lock()
        self._entry: list[Any] | None = None  # the timer's heap entry while queued
        if timeout is not None:
            _timer().add(self)

    # -- stopping -----------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop the call: its awaiting task was cancelled."""
        self._stop("cancelled")

    def expire(self) -> None:
        """Stop the call: its deadline passed (the timer calls this)."""
        self._stop("deadline")

    def _stop(self, reason: str) -> None:
        with self._lock:
            if self.stop:
                return
            self.reason = reason
            self.flag[0] = 1
            self.stop = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # the stopping thread (the timer) must live on
                import logging  # here, when it happens: `import tfrt_py` skips logging

                logging.getLogger("tfrt_py.calls").exception("a call's on_stop callback raised")

    def on_stop(self, fn: Callable[[], object]) -> None:
        """Call ``fn()`` when the call stops (at once if it has)."""
        with self._lock:
            if not self.stop:
                self._callbacks.append(fn)
                return
        fn()

    def finish(self) -> None:
        """The call is over: drop callbacks; the timer skips it from now on."""
        with self._lock:
            self._callbacks = []
        if self.timeout is not None:
            _timer().discard(self)

    # -- checking -----------------------------------------------------------------------
    def check(self, node: Any = None) -> None:
        """Raise if the call has stopped; ``node`` (an ir.Node, or None) is what was about
        to run. Cheap: one attribute read while the call is live."""
        if self.stop:
            self.raise_stop(node)

    def raise_stop(self, node: Any = None) -> NoReturn:
        """Raise the call's stop as an exception: DeadlineExceeded or CallCancelled."""
        if node is not None:
            self.node = (node.name, node.op_type)
        if self.reason == "cancelled":
            raise CallCancelled("the call was cancelled")
        raise self.deadline_error()

    def deadline_error(self) -> DeadlineExceeded:
        """The DeadlineExceeded for this call, naming the last node reported."""
        name, op = self.node if self.node is not None else (None, None)
        return DeadlineExceeded(self.timeout or 0.0, name, op)


# -- the thread's current call -----------------------------------------------------------

_local = threading.local()


def current_call() -> CallContext | None:
    """The call whose kernels this thread is running, if it has a context."""
    return getattr(_local, "call", None)


@contextmanager
def entered(call: CallContext | None) -> Iterator[None]:
    """Make ``call`` this thread's current call for the block (restoring the previous)."""
    prev = getattr(_local, "call", None)
    _local.call = call
    try:
        yield
    finally:
        _local.call = prev


def set_current(call: CallContext | None) -> CallContext | None:
    """Make ``call`` current; return the previous one (for hot paths that avoid a context
    manager; restore with ``set_current(prev)``)."""
    prev = getattr(_local, "call", None)
    _local.call = call
    return prev


# -- the timer -------------------------------------------------------------------------------


class _Timer:
    """One daemon thread expiring calls at their deadlines: a heap of [deadline, seq, call]
    entries; a finished call's entry is marked dead (call set to None) and skipped, and
    the heap is swept when dead entries are most of it."""

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []
        self._dead = 0
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, call: CallContext) -> None:
        with self._cv:
            entry = [call.deadline, next(self._seq), call]
            call._entry = entry
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="tfrt_py-deadlines",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            elif self._heap[0] is entry:
                self._cv.notify()

    def discard(self, call: CallContext) -> None:
        with self._cv:
            entry = call._entry
            if entry is None or entry[2] is None:
                return
            entry[2] = None
            call._entry = None
            self._dead += 1
            if self._dead > 64 and 2 * self._dead > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._dead = 0

    def _main(self) -> None:
        while True:
            with self._cv:
                while True:
                    if not self._heap:
                        self._cv.wait()
                        continue
                    entry = self._heap[0]
                    delay = entry[0] - time.monotonic()
                    if entry[2] is not None and delay > 0:
                        self._cv.wait(min(delay, MAX_WAIT_S))
                        continue
                    heapq.heappop(self._heap)
                    call = entry[2]
                    if call is None:
                        self._dead -= 1
                        continue
                    entry[2] = None
                    call._entry = None
                    break
            call.expire()


_the_timer: _Timer | None = None
_timer_lock = threading.Lock()


def _timer() -> _Timer:
    global _the_timer
    t = _the_timer
    if t is None:
        with _timer_lock:
            if _the_timer is None:
                _the_timer = _Timer()
            t = _the_timer
    return t


def _reset_after_fork() -> None:
    """The timer thread does not survive fork: the child starts a new one on first use."""
    global _the_timer
    _the_timer = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
