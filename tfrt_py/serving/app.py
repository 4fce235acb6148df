"""The ASGI app (Starlette) over a ModelServer.

Routes:

* ``POST /v1/models/{name}:predict`` -- body JSON ``{"inputs": {name: nested lists}}``
  (default), or ``application/x-npy`` (one-input models) / ``application/x-npz``; answer
  ``{"model": name, "outputs": {name: nested lists}}``, or .npy/.npz when the Accept
  header asks for ``application/x-npy`` / ``application/x-npz``.
* ``GET /v1/models`` (every model's specs, executor, batching policy), ``GET
  /v1/models/{name}``.
* ``GET /healthz`` (the process answers), ``GET /readyz`` (200 once every model is
  loaded and warmed, else 503 with the reason).

Every error is JSON ``{"error": message}``: 400 bad input (naming the input or the body
problem), 404 unknown model or route, 405 wrong method, 408 the body did not arrive within
the request's deadline, 413 body over ``max_body_bytes`` (refused from Content-Length
before reading, or as soon as a chunked body passes it) or arrays over
``max_decoded_bytes``, 415 unknown Content-Type, 422 the model failed on this input
(naming the node; the model warmed, so the input is what differs), 503 not ready, 504 the
model did not answer within the request's deadline (``timeout``), 500 a bug. Every error,
500 included, is an answered response: the keep-alive connection stays usable.

Which thread runs what: handlers run on the event loop; large bodies are decoded and large
outputs encoded on the server's decode threads (``body``); heavy model calls run on its
model pool (``served``). The lifespan runs ``ModelServer.start`` in a thread (``/healthz``
answers meanwhile) and ``ModelServer.close`` (bounded) at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import DeadlineExceeded, ExecutionError, InputError
from .body import body_format, read_body, request_feeds, response_body
from .codec import JSON
from .errors import RequestError
from .hub import ModelServer
from .served import ServedModel

__all__ = ["create_app", "read_body"]

Handler = Callable[[Request], Awaitable[Response]]
T = TypeVar("T")
_log = logging.getLogger("tfrt_py.serving")
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        json.dumps({"error": message}), status, headers=dict(headers or {}), media_type=JSON
    )


def _json(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status, media_type=JSON)


def _errors_as_json(fn: Handler) -> Handler:
    """``fn`` with every exception answered as JSON: RequestError with its status,
    anything else (a bug) logged and answered 500 -- never re-raised, so uvicorn keeps
    the connection (it resets one whose app raised after responding)."""

    async def handler(request: Request) -> Response:
        try:
            return await fn(request)
        except RequestError as e:
            return error_response(e.status, e.message)
        except HTTPException:
            raise
        except Exception as e:  # noqa: BLE001 - a bug: answered, logged, connection kept
            _log.exception("internal error on %s %s", request.method, request.url.path)
            return error_response(500, f"internal error: {type(e).__name__}: {str(e)[:300]}")

    return handler


class _Deadline:
    """One request's deadline on the running loop (None: no deadline)."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        loop = asyncio.get_running_loop()
        self._at = None if timeout is None else loop.time() + timeout

    def remaining(self) -> float | None:
        if self._at is None:
            return None
        return max(0.0, self._at - asyncio.get_running_loop().time())

    async def within(self, aw: Awaitable[T]) -> T:
        """``aw``, cancelled with TimeoutError when the deadline passes."""
        if self._at is None:
            return await aw
        return await asyncio.wait_for(aw, self.remaining())


def create_app(
    models: ModelServer | Mapping[str, Any], *, debug: bool = False, **server_options: Any
) -> Starlette:
    """A Starlette app serving ``models``: a ModelServer, or a mapping name -> source
    (path, bytes, loaded Model, ModelConfig) with ``server_options`` for ModelServer
    (batching, max_batch, max_wait_us, max_body_bytes, max_decoded_bytes, timeout,
    workers, log)."""
    server = models if isinstance(models, ModelServer) else ModelServer(models, **server_options)

    def missing(name: str) -> RequestError:
        if name not in server.configs:
            return RequestError(
                404, f"unknown model {name[:100]!r}; models: {sorted(server.configs)}"
            )
        return RequestError(503, f"model {name!r} is not ready: {server.error or 'loading'}")

    def served(name: str) -> ServedModel:
        m = server.get(name)
        if m is not None and m.warmed:
            return m
        raise missing(name)

    async def predict(request: Request) -> Response:
        model = served(request.path_params["name"])
        fmt = body_format(request.headers.get("content-type", JSON))
        deadline = _Deadline(server.timeout)
        try:
            body = await deadline.within(read_body(request, server.max_body_bytes))
        except _TIMEOUTS:
            raise RequestError(
                408,
                f"the request body did not arrive within the deadline of "
                f"{deadline.timeout or 0:g} s",
            ) from None
        feeds = await request_feeds(
            body, fmt, model.inputs, server.max_decoded_bytes, server.decode_pool
        )
        try:
            outputs = await deadline.within(model.predict(feeds, timeout=deadline.remaining()))
        except InputError as e:
            raise RequestError(400, f"model {model.name!r}: {e}") from None
        except ExecutionError as e:  # the model warmed, so this input made it fail
            if isinstance(e.__cause__, _TIMEOUTS):
                raise _deadline_error(model.name, server.timeout, e.__cause__) from None
            raise RequestError(422, f"model {model.name!r} failed on this input: {e}") from None
        except _TIMEOUTS as e:
            raise _deadline_error(model.name, server.timeout, e) from None
        payload, media = await response_body(
            model.name, outputs, request.headers.get("accept", ""), server.decode_pool
        )
        return Response(payload, media_type=media)

    async def list_models(request: Request) -> Response:
        return _json({"models": [m.describe() for m in server.models.values()]})

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        if name.endswith(":predict"):
            raise HTTPException(405, headers={"Allow": "POST"})
        m = server.get(name)
        if m is None:
            raise missing(name)
        return _json(m.describe())

    async def healthz(request: Request) -> Response:
        return _json({"status": "alive"})

    async def readyz(request: Request) -> Response:
        if server.ready:
            return _json({"status": "ready", "models": sorted(server.models)})
        return _json({"status": "not ready", "error": server.error or "loading"}, 503)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(server.start)
        try:
            yield
        finally:
            await asyncio.to_thread(server.close)

    def route(path: str, fn: Handler, method: str) -> Route:
        return Route(path, _errors_as_json(fn), methods=[method])

    routes = [
        route("/v1/models/{name}:predict", predict, "POST"),
        route("/v1/models", list_models, "GET"),
        route("/v1/models/{name}", one_model, "GET"),
        route("/healthz", healthz, "GET"),
        route("/readyz", readyz, "GET"),
    ]
    app = Starlette(
        debug=debug,
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.model_server = server
    return app


def _deadline_error(model: str, timeout: float | None, e: BaseException) -> RequestError:
    where = f" ({e})" if isinstance(e, DeadlineExceeded) else ""
    return RequestError(
        504,
        f"model {model!r} did not answer within the request deadline of {timeout or 0:g} s" + where,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = {
        404: f"no route {request.url.path[:200]!r}",
        405: f"method {request.method} not allowed on {request.url.path[:200]!r}",
    }.get(exc.status_code, str(exc.detail))
    return error_response(exc.status_code, what, exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(500, f"internal error: {type(exc).__name__}")
