"""Request bodies to feeds, outputs to response bodies (JSON, .npy, .npz).

JSON requests are ``{"inputs": {name: nested lists}}``; values are converted explicitly to
each input's dtype here (``json_feeds``), because tfrt_py's feed checker rightly refuses
Python floats that float32 cannot hold exactly (0.1) -- a JSON client cannot send anything
else. The conversion rounds floats to the input's float dtype but refuses what is not a
number of the right kind: strings or booleans for a numeric input, non-integral numbers
or out-of-range values for an integer input, finite values that overflow a float dtype.

Parsing is bounded whatever the body holds: nesting deeper than Python's recursion
limit, integers longer than ``JSON_MAX_INT_DIGITS`` and numbers longer than
``JSON_MAX_FLOAT_CHARS`` are refused (400) instead of raising from inside ``json``; numbers
are parsed by Python-level hooks, so a worker thread decoding a large body gives the GIL
back to the event loop every switch interval. A value is screened (its nesting and the
types of its leaves, as an object array: 8 bytes per element) before it becomes a typed
array, so a string among numbers cannot make NumPy allocate a fixed-width string array of
elements times the longest string.

Binary requests (``application/x-npy`` / ``application/x-npz``): see ``arrays``.

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
from . import json_pieces
from .errors import RequestError, names_list
from .limits import JSON_MAX_FLOAT_CHARS, JSON_MAX_INT_DIGITS

__all__ = [
    "JSON",
    "NPY",
    "NPZ",
    "RequestError",
    "convert_value",
    "encode_outputs",
    "encode_predictions",
    "json_feeds",
    "load_json",
    "parse_json",
    "response_type",
    "spec_json",
]

JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"


def spec_json(spec: TensorSpec) -> dict[str, Any]:
    """A TensorSpec as JSON: dtype name (None if unknown), shape (ints, names or null)."""
    return {
        "name": spec.name,
        "dtype": None if spec.dtype is None else str(spec.dtype),
        "shape": None if spec.shape is None else list(spec.shape),
    }


class _NumberError(ValueError):
    """A JSON number the server will not parse (raised by the parse hooks)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > JSON_MAX_INT_DIGITS:
        raise _NumberError(
            f"a JSON integer with {len(text.lstrip('-'))} digits; at most "
            f"{JSON_MAX_INT_DIGITS} are accepted (no dtype holds more)"
        )
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > JSON_MAX_FLOAT_CHARS:
        raise _NumberError(
            f"a JSON number of {len(text)} characters; at most {JSON_MAX_FLOAT_CHARS} are accepted"
        )
    return float(text)


def load_json(body: bytes, what: str = "JSON body") -> Any:
    """``body`` parsed as JSON, bounded (400 "malformed {what}" for anything that is not
    JSON, is nested too deeply, or holds numbers that are too long)."""
    try:
        return json.loads(body, parse_int=_parse_int, parse_float=_parse_float)
    except _NumberError as e:
        raise RequestError(400, f"malformed {what}: {e}") from None
    except RecursionError:
        raise RequestError(
            400, f"malformed {what}: nested too deeply (deeper than Python's recursion limit)"
        ) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int() limits
        raise RequestError(400, f"malformed {what}: {_short(e)}") from None


def parse_json(body: bytes, specs: Sequence[TensorSpec] = ()) -> tuple[dict[str, Any], bool]:
    """(input name -> JSON value, rows) of a JSON request body: the columnar
    ``{"inputs": {name: nested lists}}``, or TF Serving's row format ``{"instances":
    [row, ...]}`` (rows True), each row an object ``{name: value}`` or, for a model of one
    input (``specs``), its value; the rows are stacked into each input's first dim. 400 for
    anything else: malformed, nested too deeply, numbers too long, another shape."""
    doc = load_json(body)
    if isinstance(doc, dict) and "instances" in doc:
        extra = sorted(k for k in doc if k not in ("instances", "signature_name"))
        if extra:
            raise RequestError(400, f'unknown field(s) {names_list(extra)} beside "instances"')
        return _columns(doc["instances"], specs), True
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
        raise RequestError(
            400,
            'the JSON body must be an object {"inputs": {input name: nested lists}} or '
            '{"instances": [row, ...]}',
        )
    extra = sorted(k for k in doc if k not in ("inputs", "signature_name"))
    if extra:
        raise RequestError(
            400, f'unknown field(s) {names_list(extra)} in the JSON body; only "inputs"'
        )
    inputs: dict[str, Any] = doc["inputs"]
    return inputs, False


def _columns(rows: Any, specs: Sequence[TensorSpec]) -> dict[str, Any]:
    """TF Serving's ``instances`` as columns: input name -> the list of its rows."""
    if not isinstance(rows, list) or not rows:
        raise RequestError(400, '"instances" must be a non-empty list of rows')
    if all(isinstance(r, dict) for r in rows):
        names = list(rows[0])
        for i, r in enumerate(rows):
            if list(r) != names:
                raise RequestError(
                    400, f"instances[{i}] names {names_list(list(r))}, instances[0] "
                    f"{names_list(names)}: every row names the same inputs",
                )  # fmt: skip
        return {n: [r[n] for r in rows] for n in names}
    if any(isinstance(r, dict) for r in rows):
        raise RequestError(400, '"instances" mixes objects and values; use one form')
    if len(specs) != 1:
        raise RequestError(
            400, f"this model has {len(specs)} inputs: each row of \"instances\" must be an "
            f"object naming them ({names_list([s.name for s in specs])})",
        )  # fmt: skip
    return {specs[0].name: rows}


def encode_predictions(outputs: Mapping[str, np.ndarray]) -> bytes:
    """TF Serving's row-format answer ``{"predictions": [...]}``: per row, the one output's
    value, or an object of every output's."""
    arrays = {k: np.asarray(v) for k, v in outputs.items()}
    if len(arrays) == 1:
        preds: Any = next(iter(arrays.values()))
    else:
        n = min((a.shape[0] for a in arrays.values() if a.ndim), default=0)
        preds = [{k: a[i].tolist() if a.ndim else a.tolist() for k, a in arrays.items()}
                 for i in range(n)]  # fmt: skip
    return json_pieces.dumps({"predictions": preds})


def _short(e: BaseException, limit: int = 300) -> str:
    text = str(e)
    return text if len(text) <= limit else text[:limit] + "..."


def json_feeds(inputs: Mapping[str, Any], specs: Sequence[TensorSpec]) -> dict[str, Any]:
    """Each input's JSON value converted to its spec's dtype; RequestError(400) for a name
    that is not an input (listing at most a few of them)."""
    by_name = {s.name: s for s in specs}
    unknown = [k for k in inputs if k not in by_name]
    if unknown:
        raise RequestError(
            400,
            f"unknown input(s) {names_list(unknown)}; the model's inputs are "
            f"{names_list(list(by_name))}",
        )
    return {name: convert_value(by_name[name], value) for name, value in inputs.items()}


_LEAF_NAMES = {str: "strings", bool: "booleans", int: "numbers", float: "numbers"}


def _leaf_kinds(types: set[type]) -> str:
    """What a set of (acceptable) leaf types is, for messages: "numbers", "strings", ..."""
    names = sorted({_LEAF_NAMES[t] for t in types})
    return names[0] if len(names) == 1 else "mixed " + " and ".join(names)


def convert_value(spec: TensorSpec, value: Any) -> np.ndarray:
    """``value`` (JSON: a number, bool, string or nested lists) as an array of ``spec``'s
    dtype; RequestError(400) naming the input when it cannot be converted faithfully.

    The value is first made an object array (its shape; ragged lists leave lists as
    leaves) and its leaf types are checked, so only all-number, all-bool or all-string
    values ever reach a typed conversion."""
    want = spec.dtype
    try:
        obj = np.array(value, dtype=object)
    except (ValueError, TypeError) as e:
        raise RequestError(
            400, f"input {spec.name!r}: not a rectangular array ({_short(e)})"
        ) from None
    types = set(map(type, obj.ravel().tolist()))
    if list in types:
        raise RequestError(
            400,
            f"input {spec.name!r}: not a rectangular array (ragged lists, or nested deeper "
            "than NumPy's 64 dims)",
        )
    if not types <= _LEAF_NAMES.keys():
        raise _bad(spec, _expected(want), "null or objects")
    kind = "" if want is None else want.kind
    if obj.size == 0:
        return np.zeros(obj.shape, np.float64 if want is None else want)
    if types == {str}:
        if kind not in ("O", ""):
            raise _bad(spec, _expected(want), "strings")
        return obj
    if types == {bool}:
        if kind not in ("b", ""):
            raise _bad(spec, _expected(want), "booleans")
        return obj.astype(bool)
    if not types <= {int, float}:
        raise _bad(spec, _expected(want), _leaf_kinds(types))
    if kind in ("O", "b"):
        raise _bad(spec, _expected(want), "numbers")
    if kind in ("f", "c"):
        raw = _numbers(spec, value, np.dtype(np.float64))
        with np.errstate(all="ignore"):
            arr = raw.astype(want)
        if not np.array_equal(np.isfinite(arr), np.isfinite(raw)):
            raise RequestError(400, f"input {spec.name!r}: values out of range for {want}")
        return arr
    raw = _numbers(spec, value, None)
    if want is None:
        return raw
    if kind in "iu":
        return _to_int(spec, raw, want)
    raise RequestError(400, f"input {spec.name!r}: dtype {want} cannot be sent as JSON")


def _numbers(spec: TensorSpec, value: Any, dtype: np.dtype | None) -> np.ndarray:
    """A screened all-number value as an array (int64/uint64/float64, or ``dtype``)."""
    try:
        raw = np.asarray(value, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise RequestError(400, f"input {spec.name!r}: values out of range ({_short(e)})") from None
    if raw.dtype.kind not in "iuf":  # Python ints beyond 64 bits: an object array
        raise RequestError(400, f"input {spec.name!r}: values out of range for {spec.dtype}")
    return raw


def _expected(want: np.dtype | None) -> str:
    if want is None:
        return "numbers, booleans or strings"
    if want.kind == "O":
        return "strings"
    if want.kind == "b":
        return "booleans (true/false)"
    return "numbers"


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


def _bad(spec: TensorSpec, expected: str, got: str) -> RequestError:
    return RequestError(
        400, f"input {spec.name!r}: expected {expected} for dtype {spec.dtype}, got {got}"
    )


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
        doc = {"model": model, "outputs": {k: np.asarray(v) for k, v in outputs.items()}}
        return json_pieces.dumps(doc)
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
