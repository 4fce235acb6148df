"""Request bodies to feeds, outputs to response bodies (JSON, .npy, .npz).

JSON requests are ``{"inputs": {name: nested lists}}``; values are converted explicitly to
each input's dtype here (``json_feeds``), because tfrt_py's feed checker rightly refuses
Python floats that float32 cannot hold exactly (0.1) -- a JSON client cannot send anything
else. The conversion rounds floats to the input's float dtype but refuses what is not a
number of the right kind: strings or booleans for a numeric input, non-integral numbers
or out-of-range values for an integer input, finite values that overflow a float dtype.

Binary requests: ``application/x-npy`` (one array, for a one-input model) or
``application/x-npz`` (arrays named by input). Pickles are never loaded.

Every problem is a ``RequestError`` carrying an HTTP status and a message that names the
input (or the body) at fault. Pure functions: thread-safe.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..feeds import TensorSpec

__all__ = [
    "JSON",
    "NPY",
    "NPZ",
    "RequestError",
    "array_feeds",
    "convert_value",
    "encode_outputs",
    "json_feeds",
    "parse_json",
    "response_type",
    "spec_json",
]

JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"


class RequestError(Exception):
    """A request the server refuses: ``status`` (4xx) and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def spec_json(spec: TensorSpec) -> dict[str, Any]:
    """A TensorSpec as JSON: dtype name (None if unknown), shape (ints, names or null)."""
    return {
        "name": spec.name,
        "dtype": None if spec.dtype is None else str(spec.dtype),
        "shape": None if spec.shape is None else list(spec.shape),
    }


def parse_json(body: bytes) -> dict[str, Any]:
    """The ``inputs`` object of a JSON request body (400 for anything else)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(400, f"malformed JSON body: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
        raise RequestError(
            400, 'the JSON body must be an object {"inputs": {input name: nested lists}}'
        )
    extra = sorted(k for k in doc if k != "inputs")
    if extra:
        raise RequestError(400, f'unknown field(s) {extra} in the JSON body; only "inputs"')
    return doc["inputs"]


def json_feeds(inputs: Mapping[str, Any], specs: Sequence[TensorSpec]) -> dict[str, Any]:
    """Convert each known input's JSON value to its spec's dtype. Unknown names pass through
    unchanged (the feed checker reports them, with the model's inputs)."""
    by_name = {s.name: s for s in specs}
    out: dict[str, Any] = {}
    for name, value in inputs.items():
        spec = by_name.get(name)
        out[name] = value if spec is None else convert_value(spec, value)
    return out


def convert_value(spec: TensorSpec, value: Any) -> np.ndarray:
    """``value`` (JSON: a number, bool, string or nested lists) as an array of ``spec``'s
    dtype; RequestError(400) naming the input when it cannot be converted faithfully."""
    want = spec.dtype
    try:
        raw = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise RequestError(400, f"input {spec.name!r}: not a rectangular array ({e})") from None
    if want is None:
        return raw
    kind, got = want.kind, raw.dtype.kind
    if raw.size == 0:
        return np.zeros(raw.shape, want if kind != "O" else object)
    if kind == "O":
        if got != "U":
            raise _bad(spec, "strings", raw)
        return raw.astype(object)
    if kind == "b":
        if got != "b":
            raise _bad(spec, "booleans (true/false)", raw)
        return raw
    if got not in "iuf":
        raise _bad(spec, "numbers", raw)
    if kind in "iu":
        return _to_int(spec, raw, want)
    if kind in "fc":
        with np.errstate(all="ignore"):
            arr = raw.astype(want)
        if got == "f" and not np.array_equal(np.isfinite(arr), np.isfinite(raw)):
            raise RequestError(400, f"input {spec.name!r}: values out of range for {want}")
        return arr
    raise RequestError(400, f"input {spec.name!r}: dtype {want} cannot be sent as JSON")


def _to_int(spec: TensorSpec, raw: np.ndarray, want: np.dtype) -> np.ndarray:
    integral = raw.dtype.kind != "f" or bool(
        np.isfinite(raw).all() and (raw == np.floor(raw)).all()
    )
    if not integral:
        msg = f"input {spec.name!r}: expected integers ({want}), got non-integral numbers"
        raise RequestError(400, msg)
    info = np.iinfo(want)
    lo, hi = raw.min(), raw.max()
    if lo < info.min or hi > info.max:
        bad = lo if lo < info.min else hi
        raise RequestError(
            400,
            f"input {spec.name!r}: value {bad} out of range for {want} [{info.min}, {info.max}]",
        )
    return raw.astype(want)


def _bad(spec: TensorSpec, expected: str, raw: np.ndarray) -> RequestError:
    what = {"U": "strings", "b": "booleans", "O": "null, mixed or huge values"}.get(
        raw.dtype.kind, str(raw.dtype)
    )
    return RequestError(
        400, f"input {spec.name!r}: expected {expected} for dtype {spec.dtype}, got {what}"
    )


def array_feeds(body: bytes, specs: Sequence[TensorSpec]) -> dict[str, Any]:
    """Feeds from an .npy body (one-input models) or an .npz body (arrays named by input)."""
    try:
        loaded = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise RequestError(400, f"the body is not a valid .npy/.npz file: {e}") from None
    if isinstance(loaded, np.ndarray):
        if len(specs) != 1:
            names = [s.name for s in specs]
            raise RequestError(
                400,
                f"an .npy body holds one array, but the model has {len(specs)} inputs "
                f"{names}; send an .npz with one array per input",
            )
        return {specs[0].name: loaded}
    try:
        with loaded:
            return {k: loaded[k] for k in loaded.files}
    except ValueError as e:  # an object array inside the npz
        raise RequestError(400, f"the .npz body cannot be read without pickles: {e}") from None


def response_type(accept: str) -> str:
    """The response format a request's Accept header asks for (JSON unless .npy/.npz)."""
    if NPZ in accept:
        return NPZ
    if NPY in accept:
        return NPY
    return JSON


def encode_outputs(model: str, outputs: Mapping[str, np.ndarray], fmt: str) -> bytes:
    """The response body: JSON ``{"model", "outputs"}``; .npy for one output (else .npz)."""
    if fmt == JSON:
        doc = {"model": model, "outputs": {k: np.asarray(v).tolist() for k, v in outputs.items()}}
        return json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()
    buf = io.BytesIO()
    try:
        if fmt == NPY and len(outputs) == 1:
            np.save(buf, np.asarray(next(iter(outputs.values()))), allow_pickle=False)
        else:
            np.savez(buf, allow_pickle=False, **{k: np.asarray(v) for k, v in outputs.items()})
    except ValueError as e:  # string outputs: object arrays need pickles
        raise RequestError(
            406, f"outputs of model {model!r} cannot be sent as {fmt}: {e}; ask for JSON"
        ) from None
    return buf.getvalue()


def is_npz_request(fmt: str, outputs: Mapping[str, Any]) -> bool:
    """Whether ``encode_outputs(..., fmt)`` wrote an .npz (for the Content-Type)."""
    return fmt == NPZ or (fmt == NPY and len(outputs) != 1)
