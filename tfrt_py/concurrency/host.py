"""HostContext: the worker pool, the bridge to event loops, and cancellation (TFRT's
``HostContext``). One host serves any number of models and calls.

Who owns what: a HostContext owns its worker threads and, once needed, one background
asyncio loop thread (for ``async def`` kernels reached from synchronous ``run`` calls, so no
call ever creates an event loop). ``close()`` cancels what is outstanding and joins those
threads; a closed host refuses new work. ``default_host()`` is created on first use, sized
to the cores, and closed at interpreter exit. Every method is thread-safe.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .loop_bridge import AsyncioBridge, LoopBridge, current_bridge

__all__ = ["CancelToken", "HostContext", "default_host"]


class CancelToken:
    """A one-shot cancellation signal. ``cancel()`` from any thread; callbacks run once, on
    the cancelling thread (or at once in ``add_callback`` if already cancelled)."""

    __slots__ = ("__weakref__", "_callbacks", "_cancelled", "_lock", "reason")

    def __init__(self) -> None:
        self._cancelled = False
        self._callbacks: list[Callable[[], object]] = []
        self._lock = threading.Lock()
        self.reason = ""

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def add_callback(self, fn: Callable[[], object]) -> None:
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(fn)
                return
        fn()

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            self.reason = reason
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # one failing callback must not stop the others
                import logging  # here, when it happens: `import tfrt_py` skips logging

                logging.getLogger("tfrt_py.concurrency").exception(
                    "cancellation callback %r raised", fn
                )


def _core_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


#: Every live HostContext, so a forked child can reset them (see ``_reset_after_fork``).
_HOSTS: weakref.WeakSet[HostContext] = weakref.WeakSet()


class HostContext:
    """Worker pool + loop bridge + cancellation.

    ``num_workers`` defaults to the cores this process may use. Worker threads start on the
    first ``enqueue`` (a program that never needs the pool never starts one) and are daemon
    threads, so a forgotten host cannot hang interpreter exit. Fork-safe: in a forked child
    the host forgets the parent's threads and starts its own on first use (work queued in
    the parent but not yet run is not run in the child).
    """

    def __init__(self, num_workers: int | None = None, *, name: str = "tfrt_py") -> None:
        n = _core_count() if num_workers is None else int(num_workers)
        if n < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = n
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Callable[..., object], tuple[Any, ...]] | None]
        self._queue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._worker_ids: frozenset[int] = frozenset()
        self._lock = threading.Lock()
        self._closed = False
        self._tokens: weakref.WeakSet[CancelToken] = weakref.WeakSet()
        self._bg_thread: threading.Thread | None = None
        self._bg_bridge: AsyncioBridge | None = None
        _HOSTS.add(self)

    def _reset_after_fork(self) -> None:
        """In a forked child: the parent's threads do not exist here, so forget them (and
        the queue and lock they may have held); workers and the loop restart on first use."""
        self._queue = queue.SimpleQueue()
        self._workers = []
        self._worker_ids = frozenset()
        self._lock = threading.Lock()
        self._tokens = weakref.WeakSet()
        self._bg_thread = None
        self._bg_bridge = None

    # -- the worker pool ----------------------------------------------------------------------
    def enqueue(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on a worker thread, FIFO, fire-and-forget. ``fn`` reports its
        own results (it sets AsyncValues); an exception escaping it is logged. Raises
        RuntimeError once the host is closed."""
        if not self._workers:
            self._start_workers()
        self._queue.put((fn, args))

    def resize(self, num_workers: int) -> bool:
        """Use ``num_workers`` workers from now on, if none has started yet (they start
        on the first ``enqueue``); returns whether it took effect."""
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        with self._lock:
            if self._workers:
                return False
            self.num_workers = num_workers
            return True

    def is_worker_thread(self) -> bool:
        return threading.get_ident() in self._worker_ids

    def _start_workers(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"HostContext {self.name!r} is closed")
            if self._workers:
                return
            started = []
            for i in range(self.num_workers):
                t = threading.Thread(target=self._work, name=f"{self.name}-worker-{i}", daemon=True)
                t.start()
                started.append(t)
            self._worker_ids = frozenset(t.ident for t in started if t.ident is not None)
            self._workers = started

    def _work(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # a worker thread must survive any work item
                import logging  # here, when it happens: `import tfrt_py` skips logging

                logging.getLogger("tfrt_py.concurrency").exception(
                    "work item %r raised on a worker thread", fn
                )

    # -- event loops --------------------------------------------------------------------------
    def loop_bridge(self) -> LoopBridge:
        """The loop running on this thread (asyncio, uvloop, trio), else the background one."""
        return current_bridge() or self.background_bridge()

    def background_bridge(self) -> LoopBridge:
        """The host's own asyncio loop on its own thread, started on first use."""
        bridge = self._bg_bridge
        if bridge is None or self._closed:
            with self._lock:
                if self._closed:
                    raise RuntimeError(f"HostContext {self.name!r} is closed")
                if self._bg_bridge is None:
                    self._start_background_loop()
            bridge = self._bg_bridge
            assert bridge is not None
        return bridge

    def _start_background_loop(self) -> None:
        ready = threading.Event()
        thread = threading.Thread(
            target=self._loop_main, args=(ready,), name=f"{self.name}-loop", daemon=True
        )
        thread.start()
        ready.wait()
        self._bg_thread = thread

    def _loop_main(self, ready: threading.Event) -> None:
        import asyncio  # here, not at import: ``import tfrt_py`` stays without asyncio

        loop = asyncio.new_event_loop()
        self._bg_bridge = AsyncioBridge(loop, threading.get_ident())
        ready.set()
        try:
            loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    # -- cancellation -------------------------------------------------------------------------
    def cancel_token(self) -> CancelToken:
        """A new token; ``close()`` cancels every token still alive."""
        token = CancelToken()
        with self._lock:
            closed = self._closed
            if not closed:
                self._tokens.add(token)
        if closed:
            token.cancel("host closed")
        return token

    def release_token(self, token: CancelToken) -> None:
        """Stop tracking ``token``: the work it guarded is over (nothing left to cancel)."""
        with self._lock:
            self._tokens.discard(token)

    # -- lifetime -----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Cancel outstanding tokens, stop the background loop and the workers, join them.
        Idempotent. Must not be called from one of the host's own threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tokens = list(self._tokens)
            workers, bg, bridge = self._workers, self._bg_thread, self._bg_bridge
            self._workers = []  # enqueue() now fails instead of queueing work nobody runs
        for token in tokens:
            token.cancel("host closed")
        for _ in workers:
            self._queue.put(None)
        if bridge is not None and bg is not None:
            bridge.loop.call_soon_threadsafe(bridge.loop.stop)
            bg.join()
        for t in workers:
            t.join()

    def __enter__(self) -> HostContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._workers)} started"
        return f"<HostContext {self.name!r} workers={self.num_workers} ({state})>"


_DEFAULT: HostContext | None = None
_DEFAULT_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _DEFAULT_LOCK
    _DEFAULT_LOCK = threading.Lock()
    for host in list(_HOSTS):
        host._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def default_host() -> HostContext:
    """The process-wide host, created on first use and closed at interpreter exit."""
    global _DEFAULT
    host = _DEFAULT
    if host is None:
        with _DEFAULT_LOCK:
            if _DEFAULT is None:
                _DEFAULT = HostContext(name="tfrt_py")
                atexit.register(_DEFAULT.close)
            host = _DEFAULT
    return host
