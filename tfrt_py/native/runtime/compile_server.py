"""Native compiles in a separate process, so that a compile never holds this process's GIL.

numba compiles in Python for most of its time (type inference, lowering to IR) and holds
the GIL while it does: on a background thread it slowed a serving thread's calls 20-28x
for the seconds a compile took. So the compile worker (``worker.py``) hands each module's
source to a *compile server*: a child process (``python -m tfrt_py.native.runtime.compile_server``),
started on first use and kept for later compiles, niced to ``NICE`` so a busy host gives
the serving process the CPU first. The child compiles with ``compile.compile_source`` into
the same verified disk cache (``$TFRT_PY_CACHE_DIR``), and the worker then loads the
machine code from that cache in this process (``compile_lowered``: tens of milliseconds
instead of seconds). The code that runs is still the source in memory: the cache is
trusted exactly as for a compile in this process (docs/security.md).

Protocol, over the child's stdin and stdout: one JSON message per line each way. The
child answers ``{"ready": pid}`` once, then ``{"ok": true, "seconds": s}`` or
``{"ok": false, "error": "..."}`` per ``{"source": "..."}``. The child writes nothing else
to that stdout (its ``print``s and numba's warnings go to its stderr, which is discarded),
dies with its parent (``PR_SET_PDEATHSIG`` on Linux; otherwise at the next read, which
sees the parent's end of the pipe closed), and exits when its stdin closes.

``CompileServer.compile`` runs on the worker thread only; ``close`` (at exit, or after a
fork in the child) may run on any thread: it kills the child, which wakes a waiting
``compile`` with ``ServerGone``. When the child cannot start (no ``sys.executable``, an
embedded interpreter) the server says why in ``disabled`` and the worker compiles in
this process, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["CHILD_OPT", "NICE", "CompileServer", "ServerGone", "main"]

#: The child's niceness: it yields the CPU to the serving process on a busy host.
NICE = 10
#: numba's optimization level in the child (``NUMBA_OPT``; one the user set is kept).
#: numba's default, 3, took 10.1 s to compile a T5 encoder's box of batch 2..16 x
#: sequence 17..128 against 6.3 s at 2, and the code ran as fast: batch 8 x 128 10.7 ms
#: against 11.3 ms; BERT's box, GPT-2's and Llama's decode steps and the tree ensembles
#: alike within the noise (2-core Zen 4, AVX-512, 2026-12-01). The loops the lowering
#: writes are vectorized at either level; what level 3 adds costs time in a compile the
#: calls meanwhile wait for on the interpreter.
CHILD_OPT = "2"
#: How long the child may take to start (import numba) and to compile one module.
START_S = 120.0
COMPILE_S = 900.0


class ServerGone(RuntimeError):
    """The compile server died, timed out or was closed mid-compile."""


class CompileServer:
    """One child process compiling modules for this process (see the module docstring).
    Thread-safe: ``compile`` calls are serialized; ``close`` interrupts one in flight."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        #: what the running child was started with (``_compile_settings``)
        self._settings: tuple[tuple[str, str], ...] = ()
        self._lock = threading.Lock()
        self._closed = False
        #: why this process compiles in process ("" while the server is usable)
        self.disabled = ""
        self.pid: int | None = None
        self.compiles = 0

    def usable(self) -> bool:
        return not self.disabled and not self._closed

    def compile(self, source: str) -> float:
        """Compile ``source`` in the child; its seconds. Raises ServerGone when the child
        died, timed out or was closed (the next call starts a new one), RuntimeError with
        the child's message when the compile itself failed."""
        with self._lock:
            proc = self._started()
            try:
                _send(proc, {"source": source})
                reply = _receive(proc, COMPILE_S)
            except ServerGone:
                self._kill(proc)
                raise
        self.compiles += 1
        if reply.get("ok"):
            return float(reply.get("seconds", 0.0))
        raise RuntimeError(str(reply.get("error", "the compile failed")))

    def _started(self) -> subprocess.Popen[bytes]:
        """The running child, started now if there is none or if what it was started with
        (the cache dir, numba's environment) has changed since: a child filling another
        cache would leave this process to compile again."""
        if self._closed:
            raise ServerGone("the compile server is closed (the process is exiting)")
        proc = self._proc
        env = _environment()
        key = _compile_settings(env)
        if proc is not None:
            if proc.poll() is None and key == self._settings:
                return proc
            self._kill(proc)  # stale or dead: its pipes are closed here, not left to the GC
        proc = self._proc = _spawn(env)
        self._settings = key
        try:
            hello = _receive(proc, START_S)
        except ServerGone as e:
            self._kill(proc)
            self.disabled = f"the compile server did not start ({e})"
            raise
        self.pid = int(hello.get("ready", 0)) or None
        return proc

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc.wait(5)
        for f in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()
        if self._proc is proc:
            self._proc = None
            self.pid = None

    def close(self) -> None:
        """Kill the child (a ``compile`` in flight raises ServerGone); no compile after."""
        self._closed = True
        proc = self._proc
        if proc is not None:
            self._kill(proc)

    def forget(self) -> None:
        """In a forked child: drop the parent's server without touching it (its pipes are
        closed here only; the parent keeps using it)."""
        proc, self._proc = self._proc, None
        self._lock = threading.Lock()
        self.pid = None
        if proc is not None:
            for f in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if f is not None:
                        f.close()
            proc.returncode = 0  # not ours to wait for: Popen.__del__ must not reap it


def _environment() -> dict[str, str]:
    """This process's environment as the child must see it: the cache dir resolved and
    numba's CPU features this process's loops take (``numba_target.cpu_features``): the
    child must fill the very cache entries this process loads; and its optimization
    level (``CHILD_OPT``, which numba's cache does not key on: this process loads what
    the child compiled)."""
    from ...concurrency import numba_target
    from ...concurrency.cachedir import CACHE_ENV, cache_dir

    env = dict(os.environ)
    env[CACHE_ENV] = cache_dir()
    env["NUMBA_CPU_FEATURES"] = numba_target.cpu_features()
    env.setdefault("NUMBA_OPT", CHILD_OPT)
    return env


def _compile_settings(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of ``env`` that changes how the child compiles or where it caches: the
    resolved cache dir and numba's variables. (tfrt_py's other variables shape the source,
    which this process generates; other variables a host may change at will.)"""
    from ...concurrency.cachedir import CACHE_ENV

    return tuple(sorted((k, v) for k, v in env.items() if k.startswith("NUMBA_") or k == CACHE_ENV))


def _spawn(env: dict[str, str]) -> subprocess.Popen[bytes]:
    exe = sys.executable
    if not exe or not os.path.exists(exe):
        raise ServerGone(f"no Python executable to start ({exe!r})")
    env = dict(env)
    here = os.path.abspath(__file__)  # <root>/tfrt_py/native/runtime/compile_server.py
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    try:
        return subprocess.Popen(
            [exe, "-m", "tfrt_py.native.runtime.compile_server", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, close_fds=True,
        )  # fmt: skip
    except OSError as e:
        raise ServerGone(f"cannot start {exe}: {e}") from e


def _send(proc: subprocess.Popen[bytes], msg: dict[str, Any]) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()
    except (OSError, ValueError) as e:
        raise ServerGone(f"the compile server went away ({e})") from e


def _receive(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The child's next message; ServerGone on EOF (it died or was killed) or timeout.
    Waits in ``select`` (the GIL released)."""
    out = proc.stdout
    if out is None or out.closed:
        raise ServerGone("the compile server is closed")
    deadline = time.monotonic() + timeout
    try:
        fd = out.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerGone(f"no answer from the compile server within {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                break
        line = out.readline()
    except (OSError, ValueError) as e:
        raise ServerGone(f"the compile server went away ({e})") from e
    if not line:
        code = proc.poll()
        raise ServerGone(f"the compile server exited (status {code})")
    try:
        msg = json.loads(line)
    except ValueError as e:
        raise ServerGone(f"the compile server sent garbage ({e})") from e
    if not isinstance(msg, dict):
        raise ServerGone("the compile server sent garbage")
    return msg


def _die_with_parent(parent: int) -> None:
    """Linux: be killed when the parent dies (even by SIGKILL); then check it has not
    died already (the signal is not sent for a death before the call)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if parent and os.getppid() != parent:
        os._exit(0)


def main() -> None:
    """The child: answer compile requests until stdin closes."""
    parent = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0
    _die_with_parent(parent)
    with contextlib.suppress(OSError):
        os.nice(NICE)
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the protocol
    requests = sys.stdin.buffer

    def answer(msg: dict[str, Any]) -> None:
        reply.write(json.dumps(msg).encode() + b"\n")
        reply.flush()

    from .compile import compile_source

    answer({"ready": os.getpid()})
    for line in requests:
        t0 = time.perf_counter()
        try:
            source = json.loads(line)["source"]
            compile_source(source)
            answer({"ok": True, "seconds": time.perf_counter() - t0})
        except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
            answer({"ok": False, "error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
