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
problem), 404 unknown model or route, 405 wrong method, 413 body over ``max_body_bytes``
(refused from Content-Length before reading, or as soon as a chunked body passes it),
415 unknown Content-Type, 422 the model failed on this input (naming the node; the
model warmed, so the input is what differs), 503 not ready, 500 a bug.
The lifespan runs ``ModelServer.start`` in a thread (``/healthz`` answers meanwhile) and
closes the server's pool at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import ExecutionError, InputError
from .codec import (
    JSON,
    NPY,
    NPZ,
    RequestError,
    array_feeds,
    encode_outputs,
    is_npz_request,
    json_feeds,
    parse_json,
    response_type,
)
from .hub import ModelServer
from .served import ServedModel

__all__ = ["create_app", "read_body"]

Handler = Callable[[Request], Awaitable[Response]]


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        json.dumps({"error": message}), status, headers=dict(headers or {}), media_type=JSON
    )


def _json(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status, media_type=JSON)


def _errors_as_json(fn: Handler) -> Handler:
    async def handler(request: Request) -> Response:
        try:
            return await fn(request)
        except RequestError as e:
            return error_response(e.status, e.message)

    return handler


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one over ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise RequestError(400, f"bad Content-Length {declared!r}") from None
        if n > limit:
            raise RequestError(413, f"request body of {n} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(
    models: ModelServer | Mapping[str, Any], *, debug: bool = False, **server_options: Any
) -> Starlette:
    """A Starlette app serving ``models``: a ModelServer, or a mapping name -> source
    (path, bytes, loaded Model, ModelConfig) with ``server_options`` for ModelServer
    (batching, max_batch, max_wait_us, max_body_bytes, workers, log)."""
    server = models if isinstance(models, ModelServer) else ModelServer(models, **server_options)

    def missing(name: str) -> RequestError:
        if name not in server.configs:
            return RequestError(404, f"unknown model {name!r}; models: {sorted(server.configs)}")
        return RequestError(503, f"model {name!r} is not ready: {server.error or 'loading'}")

    def served(name: str) -> ServedModel:
        m = server.get(name)
        if m is not None and m.warmed:
            return m
        raise missing(name)

    async def predict(request: Request) -> Response:
        model = served(request.path_params["name"])
        body = await read_body(request, server.max_body_bytes)
        ctype = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
        if ctype in (NPY, NPZ, "application/octet-stream"):
            feeds = array_feeds(body, model.inputs)
        elif ctype in (JSON, "") or ctype.endswith("+json"):
            feeds = json_feeds(parse_json(body), model.inputs)
        else:
            raise RequestError(
                415, f"Content-Type {ctype!r} is not supported; send {JSON}, {NPY} or {NPZ}"
            )
        try:
            outputs = await model.predict(feeds)
        except InputError as e:
            raise RequestError(400, f"model {model.name!r}: {e}") from None
        except ExecutionError as e:  # the model warmed, so this input made it fail
            return error_response(422, f"model {model.name!r} failed on this input: {e}")
        fmt = response_type(request.headers.get("accept", ""))
        payload = encode_outputs(model.name, outputs, fmt)
        media = JSON if fmt == JSON else NPZ if is_npz_request(fmt, outputs) else NPY
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

    routes = [
        Route("/v1/models/{name}:predict", _errors_as_json(predict), methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{name}", _errors_as_json(one_model), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    app = Starlette(
        debug=debug,
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.model_server = server
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = {
        404: f"no route {request.url.path!r}",
        405: f"method {request.method} not allowed on {request.url.path!r}",
    }.get(exc.status_code, str(exc.detail))
    return error_response(exc.status_code, what, exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
