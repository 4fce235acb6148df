"""What every inference route shares, whatever its protocol: JSON errors, the request's
deadline, finding the model, reading the body in time, running the model with its errors
mapped to statuses, and counting the request in the metrics.

Status mapping of a model call (both protocols): InputError 400 (naming the input),
ExecutionError 422 (the model warmed, so this input made it fail; naming the node),
DeadlineExceeded or the request's deadline 504 (naming the model), a full queue 503 with
Retry-After (``admission``), a model not loaded or not warmed 503, an unknown model 404.

Everything here runs on the event loop, in the request's task.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import numpy as np
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..errors import DeadlineExceeded, ExecutionError, InputError
from .body import read_body
from .codec import JSON
from .errors import RequestError
from .hub import ModelServer
from .limits import DEFAULT_PRIORITY
from .metrics import ModelMetrics
from .served import ServedModel

__all__ = [
    "TIMEOUTS",
    "Deadline",
    "Handler",
    "counted",
    "error_response",
    "errors_as_json",
    "json_response",
    "read_in_time",
    "run_in_time",
    "served_model",
]

Handler = Callable[[Request], Awaitable[Response]]
T = TypeVar("T")
_log = logging.getLogger("tfrt_py.serving")
TIMEOUTS = (TimeoutError, asyncio.TimeoutError)


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        json.dumps({"error": message}), status, headers=dict(headers or {}), media_type=JSON
    )


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status, media_type=JSON)


def errors_as_json(fn: Handler) -> Handler:
    """``fn`` with every exception answered as JSON: RequestError with its status and
    headers, anything else (a bug) logged and answered 500 -- never re-raised, so uvicorn
    keeps the connection (it resets one whose app raised after responding)."""

    async def handler(request: Request) -> Response:
        try:
            return await fn(request)
        except RequestError as e:
            return error_response(e.status, e.message, e.headers)
        except HTTPException:
            raise
        except Exception as e:  # noqa: BLE001 - a bug: answered, logged, connection kept
            _log.exception("internal error on %s %s", request.method, request.url.path)
            return error_response(500, f"internal error: {type(e).__name__}: {str(e)[:300]}")

    return handler


def counted(server: ModelServer, protocol: str, fn: Handler) -> Handler:
    """``fn`` (an inference route) timed and counted in the metrics, under the model it
    used (``request.state.served``, set by ``served_model``) or, for a model that is not
    served, the name when it is a configured model and the unknown-model counter else."""
    unserved: dict[str, ModelMetrics] = {}

    async def handler(request: Request) -> Response:
        t0 = time.perf_counter()
        code = 500
        try:
            response = await fn(request)
            code = response.status_code
            return response
        except HTTPException as e:
            code = e.status_code
            raise
        finally:
            served: ServedModel | None = getattr(request.state, "served", None)
            name = request.path_params.get("name", "")
            if served is not None:
                metrics = served.metrics
            elif name in server.configs:
                metrics = unserved.get(name) or unserved.setdefault(
                    name, server.metrics.for_model(name, "")
                )
            else:
                server.metrics.unknown.labels(protocol).inc()
                metrics = None
            if metrics is not None:
                metrics.request(protocol, code, time.perf_counter() - t0)

    return handler


def served_model(server: ModelServer, request: Request, version: str | None = None) -> ServedModel:
    """The ready model the route names (``find_model``), recorded for ``counted``."""
    m = find_model(server, request.path_params["name"], version)
    request.state.served = m
    return m


def find_model(server: ModelServer, name: str, version: str | None = None) -> ServedModel:
    """The ready model ``name`` (and ``version``, when given); 404 unknown model or version,
    503 not loaded or not warmed."""
    m = server.get(name)
    if m is not None and version is not None and version != m.version:
        raise RequestError(
            404,
            f"model {name[:100]!r} has no version {version[:40]!r} loaded; it serves {m.version!r}",
        )
    if m is not None and m.warmed:
        return m
    if name not in server.configs:
        raise RequestError(404, f"unknown model {name[:100]!r}; models: {sorted(server.configs)}")
    if name in server.unloaded:
        raise RequestError(503, f"model {name!r} is not loaded (it was unloaded)")
    reason = server.errors.get(name) or "loading"
    raise RequestError(503, f"model {name!r} is not ready: {reason}")


class Deadline:
    """One request's deadline on the running loop (None: no deadline)."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        loop = asyncio.get_running_loop()
        self._at = None if timeout is None else loop.time() + timeout

    def tighten(self, seconds: float) -> None:
        """Bring the deadline forward to ``seconds`` from now (a client's own timeout)."""
        at = asyncio.get_running_loop().time() + seconds
        if self._at is None or at < self._at:
            self._at = at
            self.timeout = seconds

    def remaining(self) -> float | None:
        if self._at is None:
            return None
        return max(0.0, self._at - asyncio.get_running_loop().time())

    async def within(self, aw: Awaitable[T]) -> T:
        """``aw``, cancelled with TimeoutError when the deadline passes; it runs in the
        calling task (``asyncio.timeout_at``: no task and waiter made per call, as
        ``wait_for`` made)."""
        if self._at is None:
            return await aw
        async with asyncio.timeout_at(self._at):
            return await aw


async def read_in_time(request: Request, server: ModelServer, deadline: Deadline) -> bytes:
    """The body (413 over the limit), or 408 when it does not arrive before the deadline."""
    try:
        return await deadline.within(read_body(request, server.max_body_bytes))
    except TIMEOUTS:
        raise RequestError(
            408,
            f"the request body did not arrive within the deadline of {deadline.timeout or 0:g} s",
        ) from None


async def run_in_time(
    model: ServedModel,
    feeds: Mapping[str, Any],
    deadline: Deadline,
    level: int = DEFAULT_PRIORITY,
) -> dict[str, np.ndarray]:
    """The model's outputs for ``feeds`` within the deadline, errors mapped to statuses
    (see the module docstring)."""
    try:
        return await deadline.within(model.predict(feeds, deadline.remaining(), level))
    except InputError as e:
        raise RequestError(400, f"model {model.name!r}: {e}") from None
    except ExecutionError as e:  # the model warmed, so this input made it fail
        if isinstance(e.__cause__, TIMEOUTS):
            raise _deadline_error(model.name, deadline.timeout, e.__cause__) from None
        raise RequestError(422, f"model {model.name!r} failed on this input: {e}") from None
    except TIMEOUTS as e:
        raise _deadline_error(model.name, deadline.timeout, e) from None


def _deadline_error(model: str, timeout: float | None, e: BaseException) -> RequestError:
    where = f" ({e})" if isinstance(e, DeadlineExceeded) else ""
    return RequestError(
        504,
        f"model {model!r} did not answer within the request deadline of {timeout or 0:g} s" + where,
    )
