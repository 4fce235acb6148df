"""``tfrt-py serve --workers N``: N worker processes behind one listening socket.

The master process (``run_prefork``, on its main thread):

1. binds the socket (before any fork, so every worker accepts on the same one and a
   connection never waits on a dead worker's private queue);
2. prepares the models loaded for the app: one warm call each (plans made, pages read)
   and ``tfrt_py.sharing.share_weights``, so external-data weights (memory-mapped) and
   embedded ones (moved to a shared cache file) are in memory once for all workers; before
   each fork ``freeze_for_fork`` moves every object to the collector's permanent
   generation, so the workers' collections leave the shared pages shared;
3. forks N workers and supervises them: a worker that dies without being asked to is
   replaced by a new fork of the master (same models, same shared pages), at most once a
   second per slot while it keeps dying at start-up;
4. on SIGTERM or SIGINT, passes SIGTERM to every worker, waits for them (each drains its
   requests in flight for ``drain_timeout`` seconds, see ``run``), kills any still alive
   ``drain_timeout + EXIT_GRACE_S`` seconds later, and ends by the signal it got, as a
   single-process server does.

A worker (the forked child): resets the master's signal dispositions, sets its thread
counts (``configure_worker``: the cores divided among the workers, so N workers never
oversubscribe them; tfrt_py's pools restart on first use after fork, ``concurrency.host``),
and runs uvicorn on the inherited socket with the same limits as ``run_server``. Each
response carries ``x-tfrt-py-worker: <pid>``, so a client (and the tests) can tell the
workers apart. The worker never returns into the master's code: it leaves by ``os._exit``.

gunicorn ``--preload`` does the same with gunicorn's master (docs/scale.md): load,
``share_weights`` and ``freeze_for_fork`` in the app module, ``configure_worker`` in its
``post_fork`` hook.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from ..concurrency.threads import cores, set_process_threads
from .limits import DRAIN_TIMEOUT_S, EXIT_GRACE_S, MAX_HEAD_BYTES
from .run import _config, _Server, _url, bind

__all__ = [
    "WORKER_HEADER",
    "configure_worker",
    "freeze_for_fork",
    "prepare_models",
    "run_prefork",
]

WORKER_HEADER = b"x-tfrt-py-worker"
#: A worker that dies within this many seconds of its start is restarted no sooner than
#: this long after its previous start (a worker failing at start-up must not fork-loop).
RESTART_MIN_INTERVAL_S = 1.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def configure_worker(workers: int, threads: int | None = None) -> int:
    """In a freshly forked worker: compute with ``threads`` threads (default: this
    process's cores divided by ``workers``, at least 1); returns that number. Also the
    hook for gunicorn's ``post_fork``. (tfrt_py's own pools need nothing: they restart
    after fork on first use.)"""
    n = threads if threads is not None else max(1, cores() // max(1, workers))
    set_process_threads(n)
    return n


def freeze_for_fork() -> None:
    """In the master, right before forking: a full collection, then ``gc.freeze()``, so a
    worker's garbage collections never write to the objects it shares with the master.
    Each such write copies a page: a worker whose collector walked the master's objects
    held ~25 MiB more private memory (PSS 198 instead of 173 MiB for a model with 256 MiB
    of shared weights; it happened on some runs and not others). gunicorn ``--preload``
    apps call it at the end of the app module (``tfrt_py/examples/prefork_app.py``);
    ``run_prefork`` before every fork."""
    gc.collect()
    gc.freeze()


def prepare_models(models: Iterable[Any], log: Callable[[str], object] | None = None) -> Any:
    """In the master, before forking: a warm call of each model (on generated feeds) and
    their weights moved to shared, file-backed memory (``tfrt_py.sharing``); returns the
    ``SharedWeights`` report."""
    from ..bench.runners import random_feeds
    from ..sharing import share_weights

    models = list(models)
    for m in models:
        try:
            m.run(random_feeds(m, seed=0))
        except Exception as e:  # noqa: BLE001 - the worker's own warm-up reports it (/readyz)
            (log or (lambda _m: None))(f"tfrt-py serve: warm-up before fork failed: {e}")
    report = share_weights(*models)
    if log is not None:
        log(f"tfrt-py serve: {report}")
    return report


class _WorkerHeader:
    """ASGI middleware: every HTTP response gets ``x-tfrt-py-worker: <pid>``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.value = str(os.getpid()).encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (WORKER_HEADER, self.value)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_header)


def run_prefork(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    workers: int = 2,
    threads: int | None = None,
    log_level: str = "warning",
    on_bound: Callable[[str], object] | None = None,
    drain_timeout: float = DRAIN_TIMEOUT_S,
    max_head_bytes: int = MAX_HEAD_BYTES,
    log: Callable[[str], object] | None = None,
) -> None:
    """Serve ``app`` (``create_app``'s: its models are prepared before the fork) from
    ``workers`` forked processes on host:port until SIGTERM/SIGINT; see the module
    docstring. ``threads`` per worker (default: the cores divided among the workers)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    say = log or (lambda msg: sys.stderr.write(msg + "\n"))
    sock = bind(host, port)
    server = getattr(getattr(app, "state", None), "model_server", None)
    if server is not None:
        import tfrt_py

        loaded = [c.source for c in server.configs.values() if isinstance(c.source, tfrt_py.Model)]
        prepare_models(loaded, say)
    if on_bound is not None:
        on_bound(_url(sock))
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    # the workers' counters, summed by whichever answers a scrape (serving.metrics)
    shared = tempfile.mkdtemp(prefix="tfrt_py_metrics_") if server is not None else None

    def worker_main(slot: int) -> None:
        if server is not None and shared is not None:
            server.share_metrics(shared)
        n = configure_worker(workers, threads)
        say(f"tfrt-py serve: worker {slot} started (pid {os.getpid()}, {n} thread(s))")
        config = _config(_WorkerHeader(app), loop, log_level, drain_timeout, max_head_bytes)
        _Server(config, exit_after=drain_timeout + EXIT_GRACE_S).run(sockets=[sock])

    def cleanup() -> None:  # before the master ends (by the signal it got, maybe)
        sock.close()
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)

    def ended(pid: int) -> None:  # a worker's live gauges leave the sums
        if shared is not None:
            from .metrics import forget_worker

            forget_worker(shared, pid)

    _Supervisor(worker_main, workers, drain_timeout + EXIT_GRACE_S + 1, say, cleanup, ended).run()


class _Supervisor:
    """The master's loop: fork, reap, replace, stop. Main thread only (signals)."""

    def __init__(
        self,
        target: Callable[[int], None],
        n: int,
        stop_after: float,
        say: Callable[[str], object],
        cleanup: Callable[[], object] = lambda: None,
        ended: Callable[[int], object] = lambda pid: None,
    ) -> None:
        self.target = target
        self.cleanup = cleanup
        self.ended = ended  # called with a reaped worker's pid
        self.n = n
        self.stop_after = stop_after
        self.say = say
        self.pids: dict[int, int] = {}  # pid -> slot
        self.started: dict[int, float] = {}  # slot -> monotonic start time
        self.pending: dict[int, float] = {}  # slot -> monotonic time to restart it
        self.stop_signal: int | None = None

    def _on_signal(self, sig: int, frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = sig

    def run(self) -> None:
        previous = {s: signal.signal(s, self._on_signal) for s in _STOP_SIGNALS}
        try:
            for slot in range(self.n):
                self._spawn(slot)
            while self.stop_signal is None:
                self._reap()
                now = time.monotonic()
                for slot, at in list(self.pending.items()):
                    if at <= now and self.stop_signal is None:
                        del self.pending[slot]
                        self._spawn(slot)
                time.sleep(0.05)
            self._stop()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self.cleanup()
        if self.stop_signal is not None:
            signal.raise_signal(self.stop_signal)  # end as the signal says, as uvicorn does

    def _spawn(self, slot: int) -> None:
        freeze_for_fork()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                for s in _STOP_SIGNALS:
                    signal.signal(s, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                self.target(slot)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 - the worker ends here, never in the master
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.pids[pid] = slot
        self.started[slot] = time.monotonic()

    def _reap(self) -> None:
        while self.pids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = self.pids.pop(pid, None)
            if slot is None:
                continue
            self.ended(pid)
            lived = time.monotonic() - self.started[slot]
            self.say(
                f"tfrt-py serve: worker {slot} (pid {pid}) {_status(status)} after "
                f"{lived:.1f} s; starting a new one"
            )
            delay = RESTART_MIN_INTERVAL_S - lived if lived < RESTART_MIN_INTERVAL_S else 0.0
            self.pending[slot] = time.monotonic() + delay

    def _stop(self) -> None:
        for pid in list(self.pids):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_after
        while self.pids and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                self.pids.pop(pid, None)
            else:
                time.sleep(0.05)
        for pid in list(self.pids):
            self.say(f"tfrt-py serve: worker pid {pid} still running; killing it")
            _kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self.pids.clear()


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"
