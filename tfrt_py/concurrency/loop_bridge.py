"""The way into a running event loop from any thread: asyncio (and uvloop) or trio.

Two jobs, both per loop and without anyio on the path (see ``async_value`` for why):

* ``wait_until_available(av)`` -- the engine of ``await av`` for a pending AsyncValue. The
  awaiting task parks on its loop's own primitive; the fulfilling thread wakes it directly
  when it *is* the loop's thread, else with one ``call_soon_threadsafe``/``run_sync_soon``.
* ``LoopBridge.spawn(afn, args, on_done)`` -- run an ``async def`` kernel on the loop from
  any thread; ``on_done(value, error)`` is called on the loop's thread when it finishes,
  and not at all when the returned ``TaskHandle`` was cancelled first.

Thread detection compares ``threading.get_ident()`` with the loop's thread, recorded when
the bridge is made (a loop runs on one thread). trio is imported only when trio is running.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Coroutine, Generator, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "AsyncioBridge",
    "LoopBridge",
    "TaskHandle",
    "TrioBridge",
    "current_bridge",
    "wait_until_available",
]


def _get_running_loop() -> Any:
    """The asyncio (or uvloop) loop running on this thread, or None. asyncio is not
    imported for this (a process without it runs no asyncio loop: ~30 ms off
    ``import tfrt_py``); once it is, this name is rebound to asyncio's own C function,
    so later calls cost nothing extra."""
    global _get_running_loop
    events = sys.modules.get("asyncio.events")
    if events is None:
        return None
    _get_running_loop = events._get_running_loop
    return _get_running_loop()


AsyncFn = Callable[..., Coroutine[Any, Any, Any]]


class Waitable(Protocol):
    """What awaiting needs of an AsyncValue (``async_value`` builds on this module, so it
    is described here by shape, not imported)."""

    def and_then(self, fn: Callable[[], object]) -> None: ...

    def is_available(self) -> bool: ...


DoneFn = Callable[[Any, "BaseException | None"], object]


# -- await --------------------------------------------------------------------------------------


def wait_until_available(av: Waitable) -> Generator[Any, None, None]:
    """Suspend the current asyncio/uvloop/trio task until ``av`` is available."""
    loop = _get_running_loop()
    if loop is not None:
        yield from _wait_asyncio(av, loop)
    else:
        yield from _wait_trio(av)


def _wait_asyncio(av: Waitable, loop: asyncio.AbstractEventLoop) -> Generator[Any, None, None]:
    fut = loop.create_future()
    tid = get_ident()

    def wake() -> None:
        if get_ident() == tid:
            if not fut.done():
                fut.set_result(None)
        else:
            # RuntimeError: the loop is closed, so nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve_future, fut)

    av.and_then(wake)
    yield from fut.__await__()


def _resolve_future(fut: asyncio.Future[None]) -> None:
    if not fut.done():  # cancelled meanwhile (the awaiting task was cancelled)
        fut.set_result(None)


class _TrioWait:
    __slots__ = ("aborted", "task", "waiting")

    def __init__(self, task: Any) -> None:
        self.task = task
        self.waiting = False
        self.aborted = False


def _wait_trio(av: Waitable) -> Generator[Any, None, None]:
    trio = sys.modules.get("trio")
    if trio is None or not trio.lowlevel.in_trio_run():
        raise RuntimeError("awaiting an AsyncValue needs a running asyncio/uvloop or trio loop")
    low = trio.lowlevel
    w = _TrioWait(low.current_task())
    token = low.current_trio_token()
    tid = get_ident()

    def reschedule() -> None:  # on the trio thread
        if w.waiting and not w.aborted:
            w.waiting = False
            low.reschedule(w.task)

    def wake() -> None:
        if get_ident() == tid:
            reschedule()
        else:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(reschedule)

    av.and_then(wake)
    if av.is_available():  # became available inside and_then, or just before
        return
    w.waiting = True

    def abort(_raise_cancel: Any) -> Any:
        w.aborted = True
        return low.Abort.SUCCEEDED

    yield from low.wait_task_rescheduled(abort).__await__()


# -- spawning async kernels ---------------------------------------------------------------------


class TaskHandle:
    """A spawned coroutine; ``cancel()`` may be called from any thread, any number of times.
    Owned by whoever called ``spawn``; the bridge keeps the task alive until it finishes."""

    __slots__ = ("_bridge", "_task", "cancelled")

    def __init__(self, bridge: LoopBridge) -> None:
        self._bridge = bridge
        self._task: Any = None  # the asyncio Task or trio CancelScope, set on the loop thread
        self.cancelled = False

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        # RuntimeError (trio: RunFinishedError): the loop is gone, and its tasks with it.
        with contextlib.suppress(RuntimeError):
            self._bridge.call_soon(self._cancel_on_loop)

    def _cancel_on_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class LoopBridge:
    """A running event loop, reachable from any thread. ``thread_id`` is the loop's thread."""

    def __init__(self, thread_id: int) -> None:
        self.thread_id = thread_id

    def in_loop_thread(self) -> bool:
        return get_ident() == self.thread_id

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop's thread, soon, in FIFO order. Thread-safe."""
        raise NotImplementedError

    def spawn(self, afn: AsyncFn, args: Sequence[Any], on_done: DoneFn) -> TaskHandle:
        """Await ``afn(*args)`` on the loop (created there, so no coroutine leaks if the
        handle is cancelled before it starts); then ``on_done(value, None)`` or
        ``on_done(None, exc)`` on the loop thread, unless cancelled. Thread-safe."""
        handle = TaskHandle(self)
        if self.in_loop_thread():
            self._start(handle, afn, args, on_done)
        else:
            self.call_soon(self._start, handle, afn, args, on_done)
        return handle

    def _start(
        self, handle: TaskHandle, afn: AsyncFn, args: Sequence[Any], on_done: DoneFn
    ) -> None:
        raise NotImplementedError


class AsyncioBridge(LoopBridge):
    """An asyncio (or uvloop) loop. Spawned kernels are Tasks of that loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread_id: int) -> None:
        super().__init__(thread_id)
        self.loop = loop

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        if get_ident() == self.thread_id:
            self.loop.call_soon(fn, *args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def _start(
        self, handle: TaskHandle, afn: AsyncFn, args: Sequence[Any], on_done: DoneFn
    ) -> None:
        if not handle.cancelled:
            handle._task = self.loop.create_task(_drive(afn, args, on_done))


class TrioBridge(LoopBridge):
    """A trio run. Spawned kernels are system tasks, each in its own cancel scope (no
    nursery per call); their errors are caught and handed to ``on_done``."""

    def __init__(self, token: Any, thread_id: int) -> None:
        super().__init__(thread_id)
        self.token = token

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        self.token.run_sync_soon(fn, *args)

    def _start(
        self, handle: TaskHandle, afn: AsyncFn, args: Sequence[Any], on_done: DoneFn
    ) -> None:
        if not handle.cancelled:
            import trio

            trio.lowlevel.spawn_system_task(self._system_task, handle, afn, args, on_done)

    @staticmethod
    async def _system_task(
        handle: TaskHandle, afn: AsyncFn, args: Sequence[Any], on_done: DoneFn
    ) -> None:
        import trio

        with trio.CancelScope() as scope:
            handle._task = scope
            if handle.cancelled:
                scope.cancel()
            await _drive(afn, args, on_done)


async def _drive(afn: AsyncFn, args: Sequence[Any], on_done: DoneFn) -> None:
    # Cancellation (asyncio.CancelledError, trio.Cancelled) is a BaseException: it passes
    # through, and on_done is not called for a cancelled kernel.
    try:
        value = await afn(*args)
    except Exception as e:  # noqa: BLE001 - a kernel's failure is its result: report it
        _notify(on_done, None, e)
    else:
        _notify(on_done, value, None)


def _notify(on_done: DoneFn, value: Any, error: BaseException | None) -> None:
    try:
        on_done(value, error)
    except Exception:  # never let a callback kill the loop's task
        import logging  # here, when it happens: `import tfrt_py` skips logging

        logging.getLogger("tfrt_py.concurrency").exception("on_done callback %r raised", on_done)


def current_bridge() -> LoopBridge | None:
    """The bridge to the event loop running on this thread (asyncio, uvloop or trio), or
    None when no loop runs here."""
    loop = _get_running_loop()
    if loop is not None:
        return AsyncioBridge(loop, get_ident())
    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_run():
        return TrioBridge(trio.lowlevel.current_trio_token(), get_ident())
    return None
