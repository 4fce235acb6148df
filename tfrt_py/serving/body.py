"""Request bodies in, response bodies out: read with a size limit, decode to feeds and
encode outputs -- on the event loop when small, on the server's decode threads when large.

Which thread runs what: ``read_body``, ``request_feeds`` and ``response_body`` are
coroutines on the event loop. ``decode_feeds`` and ``encode_outputs`` are pure functions;
a body over ``INLINE_DECODE_BYTES`` (outputs over ``INLINE_ENCODE_BYTES``) is handed to
``pool`` (the ModelServer's decode threads) so that a 16 MB JSON body does not stop the
loop from answering other requests while it is parsed: the JSON number hooks run Python
code, so the decoding thread gives the GIL back every switch interval.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

import numpy as np
from starlette.requests import Request

from ..feeds import TensorSpec
from .arrays import array_feeds
from .codec import (
    JSON,
    NPY,
    NPZ,
    encode_outputs,
    encode_predictions,
    is_npz_request,
    json_feeds,
    parse_json,
    response_type,
)
from .errors import RequestError
from .limits import INLINE_DECODE_BYTES, INLINE_ENCODE_BYTES

__all__ = [
    "body_format",
    "decode_feeds",
    "maybe_offload",
    "read_body",
    "request_feeds",
    "response_body",
]

T = TypeVar("T")
_BINARY = (NPY, NPZ, "application/octet-stream")
_FORM = "application/x-www-form-urlencoded"


def body_format(content_type: str) -> str:
    """JSON or NPY (for .npy and .npz alike) from a Content-Type; 415 for anything else."""
    ctype = content_type.split(";")[0].strip().lower()
    if ctype in _BINARY:
        return NPY
    # curl -d sends application/x-www-form-urlencoded: a JSON body sent the bare way
    if ctype in (JSON, "", _FORM, "text/plain") or ctype.endswith("+json"):
        return JSON
    raise RequestError(
        415, f"Content-Type {ctype[:100]!r} is not supported; send {JSON}, {NPY} or {NPZ}"
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one over ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            n = -1
        if n < 0:
            raise RequestError(400, f"bad Content-Length {declared[:40]!r}")
        if n > limit:
            raise RequestError(413, f"request body of {n} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_feeds(
    body: bytes, fmt: str, specs: Sequence[TensorSpec], max_decoded: int
) -> tuple[dict[str, Any], bool]:
    """(feeds, rows) from a body of format ``fmt`` (``body_format``); ``rows``: the body
    was TF Serving's ``{"instances": [...]}`` (answered ``{"predictions": [...]}``).
    RequestError naming the problem. Pure: runs on the loop or on a decode thread."""
    if fmt == NPY:
        return array_feeds(body, specs, max_decoded), False
    inputs, rows = parse_json(body, specs)
    return json_feeds(inputs, specs), rows


async def request_feeds(
    body: bytes, fmt: str, specs: Sequence[TensorSpec], max_decoded: int, pool: Executor
) -> tuple[dict[str, Any], bool]:
    """``decode_feeds`` on the loop for a small body, on ``pool`` for a large one."""
    big = len(body) > INLINE_DECODE_BYTES
    return await maybe_offload(big, pool, decode_feeds, body, fmt, specs, max_decoded)


async def response_body(
    model: str,
    outputs: Mapping[str, np.ndarray],
    accept: str,
    pool: Executor,
    rows: bool = False,
) -> tuple[bytes, str]:
    """The response payload and its media type for ``accept`` (``rows``: a JSON answer in
    TF Serving's row format); encoded on ``pool`` when the outputs are large."""
    fmt = response_type(accept)
    size = sum(int(getattr(v, "nbytes", 0)) for v in outputs.values())
    big = size > INLINE_ENCODE_BYTES
    if rows and fmt == JSON:
        return await maybe_offload(big, pool, encode_predictions, outputs), JSON
    payload = await maybe_offload(big, pool, encode_outputs, model, outputs, fmt)
    media = JSON if fmt == JSON else NPZ if is_npz_request(fmt, outputs) else NPY
    return payload, media


async def maybe_offload(big: bool, pool: Executor, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: here on the loop, or on ``pool`` (awaited) when ``big``."""
    if not big:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
