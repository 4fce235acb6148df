"""Running an ASGI app under uvicorn: in the foreground (``run_server``, what ``tfrt-py
serve`` does) or on a background thread (``ServerThread``: tests, notebooks, embedding).

Both bind the listening socket themselves, so port 0 picks a free port and the bound
address is known before the first request. The foreground server uses uvloop and
httptools when installed (asyncio and h11 otherwise); ``ServerThread`` uses asyncio (an
event loop per thread). Websockets are off: this server speaks plain HTTP/1.1.

Limits on the connection level: the request line and headers of one request may hold at
most ``max_head_bytes`` (``MAX_HEAD_BYTES``; 431 and the connection closed past it --
httptools itself has no limit). Shutdown is bounded: on the first SIGTERM/SIGINT, uvicorn
stops accepting, gives requests in flight ``drain_timeout`` seconds, cancels the rest and
runs the app's shutdown; a watchdog thread started by the signal exits the process
(status 128 + signal) if it is still alive ``drain_timeout + EXIT_GRACE_S`` seconds after
the signal -- a request stuck in a model that ignores its deadline, even one holding the
event loop, cannot keep the server up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

import uvicorn

from .limits import DRAIN_TIMEOUT_S, EXIT_GRACE_S, MAX_HEAD_BYTES

__all__ = ["ServerThread", "bind", "run_server"]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one. Its proto is
    IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when it
    is, and without it every response (head and body written separately) waited ~40 ms for
    the client's delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _http_protocol(max_head_bytes: int) -> Any:
    """uvicorn's httptools protocol refusing a request head over ``max_head_bytes`` (431),
    or "h11" (whose own limit is set from the same number) without httptools."""
    if not importlib.util.find_spec("httptools"):
        return "h11"
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHeadProtocol(HttpToolsProtocol):
        """Counts the bytes of the URL and headers of each request; over the limit, the
        parser callback raises, and the 400 uvicorn would send becomes a JSON 431."""

        _head_bytes = 0

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            super().on_message_begin()

        def _count(self, n: int) -> None:
            self._head_bytes += n
            if self._head_bytes > max_head_bytes:
                raise ValueError("request head too large")

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def send_400_response(self, msg: str) -> None:
            if self._head_bytes <= max_head_bytes:
                return super().send_400_response(msg)
            body = json.dumps(
                {"error": f"request line and headers over the limit of {max_head_bytes} bytes"}
            ).encode()
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: application/json\r\nconnection: close\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            self.transport.close()

    return BoundedHeadProtocol


def _config(
    app: Any,
    loop: str,
    log_level: str,
    drain_timeout: float = DRAIN_TIMEOUT_S,
    max_head_bytes: int = MAX_HEAD_BYTES,
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        loop=loop,
        http=_http_protocol(max_head_bytes),
        ws="none",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(drain_timeout)),
        h11_max_incomplete_event_size=max_head_bytes,
    )


class _Server(uvicorn.Server):
    """uvicorn.Server whose first exit signal also starts the exit watchdog (main thread
    only: signals are caught there; ``handle_exit`` runs there, between bytecodes)."""

    def __init__(self, config: uvicorn.Config, exit_after: float) -> None:
        super().__init__(config)
        self.exit_after = exit_after
        self._watchdog: threading.Thread | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=_exit_later, args=(sig, self.exit_after), name="tfrt_py-exit", daemon=True
            )
            self._watchdog.start()
        super().handle_exit(sig, frame)


def _exit_later(sig: int, after: float) -> None:
    """Runs on the watchdog thread: exit the process ``after`` seconds from now."""
    threading.Event().wait(after)
    sys.stderr.write(
        f"tfrt-py serve: still running {after:g} s after signal {sig} "
        "(a request stuck in a model?); exiting now\n"
    )
    sys.stderr.flush()
    os._exit(128 + sig)


def run_server(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "warning",
    on_bound: Callable[[str], object] | None = None,
    drain_timeout: float = DRAIN_TIMEOUT_S,
    max_head_bytes: int = MAX_HEAD_BYTES,
) -> None:
    """Serve ``app`` on host:port until SIGINT/SIGTERM; ``on_bound(url)`` once bound.
    After the signal, requests in flight get ``drain_timeout`` seconds; the process exits
    at most ``drain_timeout + EXIT_GRACE_S`` seconds after it, whatever is still running."""
    sock = bind(host, port)
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    config = _config(app, loop, log_level, drain_timeout, max_head_bytes)
    server = _Server(config, exit_after=drain_timeout + EXIT_GRACE_S)
    if on_bound is not None:
        on_bound(_url(sock))
    server.run(sockets=[sock])


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ServerThread:
    """``app`` served by uvicorn on a daemon thread, as a context manager::

        with ServerThread(app) as url:      # returns once the app's lifespan started
            httpx.get(url + "/readyz")

    ``stop()`` asks uvicorn to exit gracefully and joins the thread.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        *,
        max_head_bytes: int = MAX_HEAD_BYTES,
    ):
        self._sock = bind(host, port)
        self.url = _url(self._sock)
        config = _config(app, "asyncio", log_level, max_head_bytes=max_head_bytes)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._main, name="uvicorn", daemon=True)
        self._error: BaseException | None = None

    def _main(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e

    def start(self, timeout: float = 60.0) -> str:
        """Start serving; returns the base URL once uvicorn has started."""
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout * 100)):
            if self.server.started or not self._thread.is_alive():
                break
            deadline.wait(0.01)
        if not self.server.started:
            self.stop()
            raise RuntimeError(f"uvicorn did not start on {self.url}: {self._error!r}")
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(30)
        self._sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
