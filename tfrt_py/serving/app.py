"""The ASGI app (Starlette) over a ModelServer: the v1 routes here, the Open Inference
Protocol (KServe v2) routes in ``v2``, ``GET /metrics`` (Prometheus, ``metrics``).

v1 routes:

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
(naming the node; the model warmed, so the input is what differs), 503 not ready or
overloaded (the model's queue is full: with ``Retry-After``), 504 the model did not answer
within the request's deadline (``timeout``), 500 a bug. Every error, 500 included, is an
answered response: the keep-alive connection stays usable.

Which thread runs what: handlers run on the event loop; large bodies are decoded and large
outputs encoded on the server's decode threads (``body``); model calls run where the
runtime puts them (``served``). The lifespan runs ``ModelServer.start`` in a thread, and at
shutdown ``ModelServer.drain`` (bounded, on the loop) then ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .body import body_format, read_body, request_feeds, response_body
from .codec import JSON
from .generate import generate_routes
from .handling import (
    Deadline,
    Handler,
    counted,
    error_response,
    errors_as_json,
    json_response,
    read_in_time,
    run_in_time,
    served_model,
)
from .hub import ModelServer
from .metrics import CONTENT_TYPE
from .v2 import v2_routes

__all__ = ["create_app", "read_body"]


def create_app(
    models: ModelServer | Mapping[str, Any] | None = None,
    *,
    debug: bool = False,
    grpc: str | None = None,
    grpc_required: bool = True,
    **server_options: Any,
) -> Starlette:
    """A Starlette app serving ``models``: a ModelServer, or a mapping name -> source
    (path, bytes, loaded Model, ModelConfig) with ``server_options`` for ModelServer
    (repository, batching, max_batch, max_wait_us, max_body_bytes, max_decoded_bytes,
    timeout, max_concurrency, max_queue, load_options, warmup, log). ``grpc``: "host:port"
    to serve the protocol over gRPC too, on the same loop (``grpc_service``; port 0 picks
    one: ``app.state.grpc_port``); ``grpc_required=False`` logs and serves HTTP alone when
    grpcio is missing or the port cannot be bound."""
    server = models if isinstance(models, ModelServer) else ModelServer(models, **server_options)
    app = Starlette(
        debug=debug,
        routes=[*_v1_routes(server), *v2_routes(server), *generate_routes(server)],
        lifespan=_lifespan(server, grpc, grpc_required),
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.model_server = server
    return app


def _lifespan(
    server: ModelServer, grpc: str | None, grpc_required: bool
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """Start ``server`` (in a thread), the gRPC frontend and, in a pre-forked worker, the
    task that sets its gauges, before the app serves; stop them, drain and close the server
    after."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(server.start)
        frontend = await _start_grpc(server, grpc, grpc_required) if grpc else None
        app.state.grpc_port = frontend.port if frontend is not None else None
        # a pre-forked worker's gauges, summed with the other workers' at a scrape
        gauges = asyncio.create_task(server.metrics.live.every()) if server.metrics.shared else None
        try:
            yield
        finally:
            if gauges is not None:
                gauges.cancel()
            if frontend is not None:
                await frontend.stop(server.close_timeout)
            await server.drain()
            await asyncio.to_thread(server.close)

    return lifespan


async def _start_grpc(server: ModelServer, address: str, required: bool) -> Any:
    """The started GrpcFrontend on ``address``, or None (logged) when not ``required``
    and grpcio is missing or the address cannot be bound."""
    try:
        from .grpc_service import GrpcFrontend

        frontend = GrpcFrontend(server, address)
        port = await frontend.start()
    except (ImportError, RuntimeError) as e:
        if required:
            raise
        server.say(f"tfrt-py serve: gRPC off ({type(e).__name__}: {e}; "
                   "pip install 'tfrt-py[grpc]' for grpcio)")  # fmt: skip
        return None
    host = address.rpartition(":")[0]
    server.say(f"tfrt-py serve: gRPC (inference.GRPCInferenceService) on {host}:{port}")
    return frontend


def _v1_routes(server: ModelServer) -> list[Route]:
    """The v1 routes, health and metrics over ``server`` (see the module docstring)."""

    async def predict(request: Request) -> Response:
        model = served_model(server, request)
        refused = model.overloaded()  # before the body is even read
        if refused is not None:
            raise refused
        fmt = body_format(request.headers.get("content-type", JSON))
        deadline = Deadline(server.timeout)
        body = await read_in_time(request, server, deadline)
        feeds, rows = await request_feeds(
            body, fmt, model.inputs, server.max_decoded_bytes, server.decode_pool
        )
        outputs = await run_in_time(model, feeds, deadline)
        payload, media = await response_body(
            model.name, outputs, request.headers.get("accept", ""), server.decode_pool, rows
        )
        return Response(payload, media_type=media)

    async def list_models(request: Request) -> Response:
        return json_response({"models": [m.describe() for m in server.models.values()]})

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        if name.endswith(":predict"):
            raise HTTPException(405, headers={"Allow": "POST"})
        m = server.get(name)
        if m is None:
            served_model(server, request)  # raises the 404 or 503
            raise AssertionError("unreachable")
        return json_response(m.describe())

    async def healthz(request: Request) -> Response:
        return json_response({"status": "alive"})

    async def readyz(request: Request) -> Response:
        if server.ready:
            return json_response({"status": "ready", "models": sorted(server.models)})
        return json_response({"status": "not ready", "error": server.error or "loading"}, 503)

    async def metrics(request: Request) -> Response:
        return Response(server.metrics.exposition(), media_type=CONTENT_TYPE)

    def route(path: str, fn: Handler, method: str) -> Route:
        return Route(path, errors_as_json(fn), methods=[method])

    return [
        Route(
            "/v1/models/{name}:predict",
            counted(server, "v1", errors_as_json(predict)),
            methods=["POST"],
        ),
        route("/v1/models", list_models, "GET"),
        route("/v1/models/{name}", one_model, "GET"),
        route("/healthz", healthz, "GET"),
        route("/readyz", readyz, "GET"),
        route("/metrics", metrics, "GET"),
    ]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = {
        404: f"no route {request.url.path[:200]!r}",
        405: f"method {request.method} not allowed on {request.url.path[:200]!r}",
    }.get(exc.status_code, str(exc.detail))
    return error_response(exc.status_code, what, exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(500, f"internal error: {type(exc).__name__}")
