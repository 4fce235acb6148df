"""v2 request and response bodies: JSON alone, or JSON followed by binary tensor data (the
binary tensor data extension, what tritonclient sends and asks for by default).

A binary request carries ``Inference-Header-Content-Length: N``: the first N bytes of the
body are the JSON request, the rest is the data of each input that declares
``"parameters": {"binary_data_size": n}``, in the order of ``inputs``: fixed-size types
as their little-endian bytes, row-major (BOOL one byte, 0 or 1), BYTES as each element's
4-byte little-endian length and then its bytes. A response whose outputs were asked for
with ``binary_data`` (or ``binary_data_output``) is built the same way and carries the
same header; its Content-Type is ``application/octet-stream``.

Bounds, before anything is allocated: the header's length is digits and at most the body
(which ``max_body_bytes`` bounded); the binary sizes must add up to exactly the bytes after
the JSON; every size was checked against its input's shape and datatype
(``v2_codec.parse_request``); a BYTES element's length may not pass the data left, nor the
elements their declared count. Each input is copied once, into an aligned array the model
may keep. Pure functions, thread-safe: run on the event loop for small bodies and on the
server's decode threads for large ones.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..feeds import TensorSpec
from . import json_pieces
from .codec import JSON, load_json
from .errors import RequestError
from .v2_codec import (
    InferRequest,
    TensorIn,
    answer_array,
    datatype_of,
    json_data,
    parse_request,
    tensor_from_json,
)

__all__ = ["HEADER_LENGTH", "OCTETS", "decode_infer", "encode_infer"]

HEADER_LENGTH = "Inference-Header-Content-Length"
OCTETS = "application/octet-stream"
_LEN = struct.Struct("<I")


def decode_infer(
    body: bytes,
    header_length: str | None,
    model: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_decoded: int,
) -> tuple[InferRequest, dict[str, np.ndarray]]:
    """The checked request and its feeds from a v2 body (``header_length``: the value of
    ``Inference-Header-Content-Length``, None when absent)."""
    head, data = _split(body, header_length)
    if data is None and not _is_utf8(head):
        raise RequestError(
            400,
            "the body is not UTF-8 JSON: binary tensor data follows a JSON header whose length "
            f"the {HEADER_LENGTH} header gives, and this request has none",
        )
    try:
        doc = load_json(head, "JSON request" if data is None else "JSON request header")
    except RequestError as e:
        if data is None and "Extra data" in e.message:
            raise RequestError(400, f"{e.message}; binary tensor data after the JSON needs "
                                    f"the {HEADER_LENGTH} header") from None  # fmt: skip
        raise
    return decode_document(doc, data, model, inputs, outputs, max_decoded)


def decode_document(
    doc: Any,
    data: memoryview | None,
    model: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_decoded: int,
) -> tuple[InferRequest, dict[str, np.ndarray]]:
    """The checked request and its feeds from a parsed v2 document and the binary data
    after it (None: none; the gRPC frontend's raw contents, joined)."""
    req = parse_request(doc, model, inputs, outputs, max_decoded, data is not None)
    feeds = _binary_inputs(req.inputs, data) if data is not None else {}
    for t in req.inputs:
        if t.binary_size is None:
            feeds[t.spec.name] = tensor_from_json(t)
    return req, feeds


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview | None]:
    if header_length is None:
        return body, None
    text = header_length.strip()
    if not text.isdigit() or len(text) > 20:
        raise RequestError(
            400, f"{HEADER_LENGTH} must be a number of bytes, got {header_length[:40]!r}"
        )
    n = int(text)
    if n > len(body):
        raise RequestError(400, f"{HEADER_LENGTH} is {n}, but the body has only {len(body)} bytes")
    return body[:n], memoryview(body)[n:]


def _binary_inputs(tensors: Sequence[TensorIn], data: memoryview) -> dict[str, np.ndarray]:
    declared = sum(t.binary_size or 0 for t in tensors)
    if declared != len(data):
        raise RequestError(
            400,
            f"{len(data)} bytes of binary data follow the JSON header, but the inputs' "
            f"binary_data_size add up to {declared}",
        )
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for t in tensors:
        if t.binary_size is None:
            continue
        raw = data[offset : offset + t.binary_size]
        offset += t.binary_size
        feeds[t.spec.name] = _bytes_tensor(t, raw) if t.datatype == "BYTES" else _fixed(t, raw)
    return feeds


def _fixed(t: TensorIn, raw: memoryview) -> np.ndarray:
    """A fixed-size input: its little-endian bytes copied into a fresh aligned array."""
    buf = np.empty(len(raw), np.uint8)
    buf[:] = np.frombuffer(raw, np.uint8)
    if t.datatype == "BOOL" and buf.size and int(buf.max()) > 1:
        raise RequestError(400, f"input {t.spec.name!r}: BOOL bytes must be 0 or 1")
    arr = buf.view(t.dtype.newbyteorder("<")).reshape(t.shape)
    return arr.astype(t.dtype, copy=False)


def _bytes_tensor(t: TensorIn, raw: memoryview) -> np.ndarray:
    """A BYTES input: ``count`` length-prefixed elements, exactly; str for a string
    input (UTF-8)."""
    name, count, n = t.spec.name, t.count, len(raw)
    out = np.empty(count, object)
    offset = 0
    for i in range(count):
        if offset + 4 > n:
            raise RequestError(
                400, f"input {name!r}: BYTES data ends after {i} of {count} elements"
            )
        (length,) = _LEN.unpack_from(raw, offset)
        offset += 4
        if length > n - offset:
            raise RequestError(
                400,
                f"input {name!r}: BYTES element {i} declares {length} bytes, but only "
                f"{n - offset} remain",
            )
        try:
            out[i] = str(raw[offset : offset + length], "utf-8")
        except UnicodeDecodeError:
            raise RequestError(
                400, f"input {name!r}: BYTES element {i} is not UTF-8 (a string input)"
            ) from None
        offset += length
    if offset != n:
        raise RequestError(
            400, f"input {name!r}: {n - offset} bytes left after its {count} BYTES elements"
        )
    return out.reshape(t.shape)


def encode_infer(
    model: str, version: str, req: InferRequest, outputs: Mapping[str, Any]
) -> tuple[bytes, dict[str, str], str]:
    """The response body, its extra headers and its media type."""
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, binary in req.outputs:
        arr = answer_array(name, outputs[name], name in req.dense)
        datatype = datatype_of(arr.dtype)
        if datatype is None:
            raise RequestError(
                501, f"output {name!r} has dtype {arr.dtype}, which no v2 datatype carries"
            )
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            blob = encode_blob(arr, datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = json_data(name, arr)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version}
    if req.id is not None:
        doc["id"] = req.id
    doc["outputs"] = entries
    head = json_pieces.dumps(doc)
    if not blobs:
        return head, {}, JSON
    return head + b"".join(blobs), {HEADER_LENGTH: str(len(head))}, OCTETS


def encode_blob(arr: np.ndarray, datatype: str) -> bytes:
    """An output's binary form: little-endian row-major, or length-prefixed BYTES."""
    return _encode_bytes(arr) if datatype == "BYTES" else _encode_fixed(arr)


def _encode_fixed(arr: np.ndarray) -> bytes:
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _encode_bytes(arr: np.ndarray) -> bytes:
    parts = []
    for v in arr.ravel().tolist():
        b = v if isinstance(v, bytes) else str(v).encode("utf-8")
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)
