"""AsyncValue: a value that will be available later (TFRT's ``AsyncValue``), and helpers
(``make_available``, ``run_when_ready``).

States: *pending* -> *concrete* (``set(value)``) or *error* (``set_error(exc)``); exactly one
transition, guarded by one lock. ``is_available()`` is true in either final state (TFRT's
``IsAvailable``); ``is_concrete()``/``is_error()`` say which.

Which thread runs ``and_then`` callbacks: the thread that fulfils the value, synchronously
inside ``set``/``set_error`` -- or the calling thread, at once, when the value is already
available. This is TFRT's ``AndThen`` rule, not asyncio's (which always schedules callbacks
on its loop): a callback that continues a dataflow graph should run where the value was
made, without a hop (~3-6 µs for ``call_soon``, ~150 µs for a thread-pool hand-off). Hence
callbacks must be short and must not block; one that needs the event loop hops there itself
(``await`` does exactly that, see ``loop_bridge``).

Awaiting: ``await av`` works on asyncio, uvloop and trio. An available value returns at
once without touching the loop; a pending one parks the task on a per-loop primitive (an
asyncio Future, or trio's ``wait_task_rescheduled``) and is woken from the fulfilling
thread by ``call_soon_threadsafe``/``run_sync_soon`` -- or directly when that thread is the
loop's own. We measured bridging through anyio instead (an ``anyio.Event`` set through
``anyio.from_thread``): it costs more per await (a wrapper Event, and a blocking round trip
for the setter when it is a worker thread) -- see ``benchmarks/async_overhead.py`` -- so the
per-loop path is what tfrt_py uses.

Thread safety: every method may be called from any thread. Nothing here imports NumPy or
the rest of tfrt_py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable
from typing import Any, Generic, TypeVar

from .loop_bridge import wait_until_available

__all__ = [
    "AsyncValue",
    "make_available",
    "run_when_ready",
]

T = TypeVar("T")

_PENDING, _CONCRETE, _ERROR = 0, 1, 2
_STATE_NAMES = ("pending", "available", "error")
#: Guards every pending -> final transition and every callback registration on a pending
#: value. One lock for all values: it is held for a few bytecodes, and a lock per value
#: would cost an allocation per value (most values never see contention).
_LOCK = threading.Lock()


class AsyncValue(Generic[T]):
    """A single-assignment value, possibly not available yet.

    Ownership: whoever creates a pending AsyncValue owns the duty to ``set`` or
    ``set_error`` it exactly once; any number of readers may ``and_then``, ``await`` or
    ``wait`` on it. Setting a value twice raises ``RuntimeError``.
    """

    __slots__ = ("__weakref__", "_callbacks", "_state", "_value")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None  # the value, or the exception when in the error state
        self._callbacks: list[Callable[[], object]] | None = None

    # -- fulfilling (the owner) ---------------------------------------------------------------
    def set(self, value: T) -> None:
        """Make the value concrete and run the callbacks on this thread, in order."""
        self._resolve(_CONCRETE, value)

    def set_error(self, error: BaseException) -> None:
        """Put the value in the error state; callbacks run on this thread, in order."""
        if not isinstance(error, BaseException):
            raise TypeError(f"set_error takes an exception, got {error!r}")
        self._resolve(_ERROR, error)

    def _resolve(self, state: int, value: Any) -> None:
        with _LOCK:
            if self._state != _PENDING:
                raise RuntimeError(f"{self!r} is already set; an AsyncValue is set once")
            self._value = value
            self._state = state
            callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for fn in callbacks:
                _call(fn)

    # -- reading ------------------------------------------------------------------------------
    def and_then(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` once the value is available (concrete or error).

        Already available: ``fn`` runs now, on the calling thread. Otherwise it runs later on
        the thread that fulfils the value. Exceptions from ``fn`` are logged, not raised.
        """
        if self._state == _PENDING:
            with _LOCK:
                if self._state == _PENDING:
                    if self._callbacks is None:
                        self._callbacks = [fn]
                    else:
                        self._callbacks.append(fn)
                    return
        _call(fn)

    def is_available(self) -> bool:
        """True once the value is concrete or an error (no longer pending)."""
        return self._state != _PENDING

    def is_concrete(self) -> bool:
        return self._state == _CONCRETE

    def is_error(self) -> bool:
        return self._state == _ERROR

    @property
    def state(self) -> str:
        """``"pending"``, ``"available"`` or ``"error"``."""
        return _STATE_NAMES[self._state]

    @property
    def value(self) -> T:
        """The value; raises the error in the error state, RuntimeError while pending."""
        if self._state == _CONCRETE:
            return self._value  # type: ignore[no-any-return,unused-ignore]
        if self._state == _ERROR:
            raise self._value
        raise RuntimeError(f"{self!r} is not available yet")

    @property
    def error(self) -> BaseException | None:
        """The error, or None (pending or concrete)."""
        return self._value if self._state == _ERROR else None

    def wait(self, timeout: float | None = None) -> T:
        """Block the calling thread until available; return the value or raise the error.

        For synchronous code only: waiting on an event loop's thread for a value that loop
        must produce deadlocks. Raises TimeoutError after ``timeout`` seconds.
        """
        if self._state == _PENDING:
            gate = threading.Lock()
            gate.acquire()
            self.and_then(gate.release)
            # a timeout past the platform's limit (1e300, inf) waits without one: the
            # lock would raise OverflowError
            limit = -1 if timeout is None or timeout >= threading.TIMEOUT_MAX else timeout
            if not gate.acquire(timeout=limit):
                raise TimeoutError(f"{self!r} not available after {timeout} s")
        return self.value

    def __await__(self) -> Generator[Any, None, T]:
        """``await av``: the value, or raises its error. Cancelling the awaiting task leaves
        the AsyncValue untouched (it is not cancelled; its producer finishes or not)."""
        if self._state == _PENDING:
            yield from wait_until_available(self)
        return self.value

    def __repr__(self) -> str:
        name = type(self).__name__
        if self._state == _PENDING:
            return f"<{name} pending>"
        if self._state == _ERROR:
            return f"<{name} error: {self._value!r}>"
        text = repr(self._value)
        if len(text) > 60:
            text = text[:57] + "..."
        return f"<{name} available: {text}>"


def make_available(value: T) -> AsyncValue[T]:
    """An AsyncValue that is already concrete (TFRT's MakeAvailableAsyncValueRef)."""
    av: AsyncValue[T] = AsyncValue()
    av._value = value
    av._state = _CONCRETE
    return av


def run_when_ready(values: Iterable[AsyncValue[Any]], fn: Callable[[], object]) -> None:
    """Run ``fn()`` once every value is available (concrete or error).

    One shared countdown, not a callback chain: each pending value gets one ``and_then``
    that pops a token; exactly one caller pops the last token and runs ``fn`` -- on the
    thread that fulfilled the last value, or now on this thread if all are available.
    ``list.pop`` is atomic, so the countdown needs no lock.
    """
    pending = [v for v in values if v._state == _PENDING]
    if not pending:
        _call(fn)
        return
    tokens = list(range(len(pending)))

    def one() -> None:
        if tokens.pop() == 0:
            fn()

    for v in pending:
        v.and_then(one)


def _call(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:  # a callback's failure must not stop the others (logged, not raised)
        import logging  # here: a callback that raises is rare, and logging costs 2 ms to import

        logging.getLogger("tfrt_py.concurrency").exception("AsyncValue callback %r raised", fn)
