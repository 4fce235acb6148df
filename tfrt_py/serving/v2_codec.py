"""The Open Inference Protocol's (KServe v2) inference request and response, as data.

Request (``POST /v2/models/NAME[/versions/V]/infer``), JSON::

    {"id": "optional, echoed", "parameters": {"timeout": µs, "priority": n,
                                              "binary_data_output": bool},
     "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],
                 "data": [1, 2, 3, 4, 5, 6]}],               # flat row-major, or nested
     "outputs": [{"name": "y", "parameters": {"binary_data": true}}]}   # optional selection

With the binary tensor extension (``v2_binary``) an input has ``"parameters":
{"binary_data_size": n}`` instead of ``data``, and its bytes follow the JSON. Response::

    {"model_name": "m", "model_version": "1", "id": "...",
     "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 1], "data": [...]}]}

(a binary output has ``"parameters": {"binary_data_size": n}`` instead of ``data``).

Nothing is allocated on a request's word: ``parse_request`` checks every input against the
model before any array exists -- its name, its ``datatype`` (the model's, exactly), its
``shape`` (ints, at most ``MAX_TENSOR_RANK`` dims, the model's rank and static dims, and
dims whose product -- zeros left out, a Python int, so nothing wraps around -- stays
below 2**62, so NumPy can make the array),
the bytes it will decode to against ``max_decoded_bytes`` (413), and a
``binary_data_size`` against what the shape and datatype make (400). Data then decodes
into exactly the declared shape. ``timeout`` is in microseconds (as tritonclient sends
it): the request's deadline becomes the earlier of it and the server's. ``priority``
follows Triton: 0 or none is the default level, 1 the highest (``admission``).

Every problem is a RequestError (400, 413, 501) naming the input or field. Pure
functions: thread-safe (large bodies are decoded on the server's decode threads).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..feeds import TensorSpec
from ..records import record
from .admission import priority_level
from .codec import convert_value
from .errors import RequestError, names_list
from .limits import MAX_PRIORITY, MAX_TENSOR_RANK

__all__ = [
    "InferRequest",
    "TensorIn",
    "answer_array",
    "datatype_of",
    "datatypes",
    "json_data",
    "metadata_shape",
    "parse_request",
    "spec_datatype",
    "tensor_from_json",
]

#: Bytes a BYTES element costs once decoded besides its own bytes (the Python object).
BYTES_ELEMENT_COST = 64
_INT_TYPES = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")


@functools.cache
def datatypes() -> dict[str, np.dtype]:
    """v2 datatype name -> NumPy dtype (BYTES: object arrays of str; BF16: ml_dtypes)."""
    import ml_dtypes

    table = {name: np.dtype(name.lower()) for name in _INT_TYPES}
    table.update(
        BOOL=np.dtype(bool),
        FP16=np.dtype(np.float16),
        FP32=np.dtype(np.float32),
        FP64=np.dtype(np.float64),
        BF16=np.dtype(ml_dtypes.bfloat16),
        BYTES=np.dtype(object),
    )
    return table


def datatype_of(dtype: np.dtype | None) -> str | None:
    """The v2 datatype of a model's dtype (None: none; e.g. complex64, float8, unknown)."""
    if dtype is None:
        return None
    for name, dt in datatypes().items():
        if dt == dtype:
            return name
    if dtype.kind in "US":
        return "BYTES"
    return None


def spec_datatype(spec: TensorSpec) -> str | None:
    """The v2 datatype an output is answered in: its tensor's, or BYTES for a sequence of
    maps (skl2onnx's ZipMap: one JSON object per row, ``answer_array``); None when no
    datatype carries it (other sequences, maps, optionals)."""
    if spec.type.startswith("seq<map<"):
        return "BYTES"
    return datatype_of(spec.dtype)


def answer_array(name: str, value: Any, dense: bool = False) -> np.ndarray:
    """An output's value as the array a v2 response carries: a tensor as it is; a
    sequence of maps (ZipMap's ``[{class: p}, ...]``) as one JSON object text per row,
    keys as strings, in the map's order -- or, ``dense``, FP32 [rows, classes], the
    columns in that order (every row must have the same keys); anything else that is
    not a tensor a 501."""
    if isinstance(value, np.ndarray):
        return value
    if dense and isinstance(value, list) and all(isinstance(row, dict) for row in value):
        keys = list(value[0]) if value else []
        if any(list(row) != keys for row in value):
            raise RequestError(
                422, f"output {name!r}: its rows have different keys, so no dense form"
            )
        return np.array([list(row.values()) for row in value], np.float32).reshape(
            len(value), len(keys)
        )
    if isinstance(value, list) and all(isinstance(row, dict) for row in value):
        out = np.empty(len(value), object)
        for i, row in enumerate(value):
            out[i] = json.dumps({str(k): _plain(v) for k, v in row.items()}, allow_nan=True)
        return out
    if np.isscalar(value):
        return np.asarray(value)
    raise RequestError(
        501,
        f"output {name!r} is a {type(value).__name__}, which no v2 datatype carries "
        "(tensors and sequences of maps are answered)",
    )


def _plain(v: Any) -> Any:
    """A map value as JSON writes it (NumPy scalars as Python numbers)."""
    return v.item() if isinstance(v, np.generic) else v


def metadata_shape(shape: Sequence[int | str | None] | None) -> list[int]:
    """A spec's shape as v2 metadata: ints, -1 for a dynamic dim ([-1] for unknown rank)."""
    if shape is None:
        return [-1]
    return [d if isinstance(d, int) else -1 for d in shape]


@record(frozen=True)
class TensorIn:
    """One request input, checked against the model: its ``spec`` and ``dtype`` (the
    model's; object for strings), the shape asked for, the element count, and either
    ``data`` (JSON) or ``binary_size`` (bytes after the JSON)."""

    spec: TensorSpec
    dtype: np.dtype
    datatype: str
    shape: tuple[int, ...]
    count: int
    data: Any = None
    binary_size: int | None = None


@record(frozen=True)
class InferRequest:
    """A checked request: ``outputs`` are (name, binary?) in the order to answer them;
    ``dense``: the sequence-of-maps outputs asked for as one column per class
    (``"parameters": {"dense": true}``, ``answer_array``)."""

    id: str | None
    inputs: list[TensorIn]
    outputs: list[tuple[str, bool]]
    timeout_s: float | None
    level: int
    dense: frozenset[str] = frozenset()


def _obj(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(400, f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _uint(value: Any, what: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise RequestError(400, f"{what} must be an integer in [0, {top}], got {value!r:.60}")
    return value


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(400, f"{what} must be true or false, got {value!r:.60}")
    return value


def _unsupported(params: Mapping[str, Any], what: str) -> None:
    for key in params:
        if key.startswith("shared_memory"):
            raise RequestError(400, f"{what}: shared memory ({key!r}) is not supported")


def parse_request(
    doc: Any,
    model: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_decoded: int,
    binary: bool,
) -> InferRequest:
    """The request ``doc`` (parsed JSON) checked against the model's specs; ``binary``:
    binary data may follow the JSON (the request had ``Inference-Header-Content-Length``).
    Unknown fields and parameters are ignored, as the protocol allows."""
    if not isinstance(doc, dict):
        raise RequestError(400, 'the request must be a JSON object with an "inputs" list')
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise RequestError(400, f'"id" must be a string, got {type(rid).__name__}')
    params = _obj(doc.get("parameters"), '"parameters"')
    _unsupported(params, "the request")
    seq = params.get("sequence_id", 0)
    if seq not in (0, "") or isinstance(seq, bool):
        raise RequestError(400, "sequence batching (parameters.sequence_id) is not supported")
    timeout_us = _uint(params.get("timeout", 0), "parameters.timeout (microseconds)", 2**63)
    level = priority_level(_uint(params.get("priority", 0), "parameters.priority", MAX_PRIORITY))
    binary_out = _flag(params.get("binary_data_output", False), "parameters.binary_data_output")
    tensors = _parse_inputs(doc.get("inputs"), model, inputs, max_decoded, binary)
    dense: set[str] = set()
    wanted = _parse_outputs(doc.get("outputs"), model, outputs, binary_out, dense)
    timeout = timeout_us / 1e6 if timeout_us else None
    return InferRequest(rid, tensors, wanted, timeout, level, frozenset(dense))


def _parse_inputs(
    value: Any, model: str, specs: Sequence[TensorSpec], max_decoded: int, binary: bool
) -> list[TensorIn]:
    if not isinstance(value, list):
        raise RequestError(400, '"inputs" must be a list of tensors')
    by_name = {s.name: s for s in specs}
    if len(value) > len(specs):
        raise RequestError(
            400,
            f"{len(value)} inputs sent, but model {model!r} has {len(specs)}: "
            f"{names_list(list(by_name))}",
        )
    seen: set[str] = set()
    tensors = []
    left = max_decoded
    for i, t in enumerate(value):
        tensor = _parse_input(t, i, model, by_name, binary)
        if tensor.spec.name in seen:
            raise RequestError(400, f"input {tensor.spec.name!r} is sent more than once")
        seen.add(tensor.spec.name)
        cost = tensor.count * tensor.dtype.itemsize
        if tensor.datatype == "BYTES":
            cost = tensor.count * BYTES_ELEMENT_COST + (tensor.binary_size or 0)
        left -= cost
        if left < 0:
            raise RequestError(
                413,
                f"input {tensor.spec.name!r}: shape {list(tensor.shape)} of {tensor.datatype} "
                f"({cost} bytes decoded) takes the request over the limit of {max_decoded} "
                "decoded bytes",
            )
        tensors.append(tensor)
    return tensors


def _parse_input(
    t: Any, i: int, model: str, by_name: Mapping[str, TensorSpec], binary: bool
) -> TensorIn:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise RequestError(400, f'inputs[{i}] must be an object with a string "name"')
    name = t["name"]
    spec = by_name.get(name)
    if spec is None:
        raise RequestError(
            400,
            f"unknown input {name[:100]!r} for model {model!r}; its inputs are "
            f"{names_list(list(by_name))}",
        )
    want = datatype_of(spec.dtype)
    if want is None:
        raise RequestError(
            501,
            f"input {name!r} of model {model!r} has dtype {spec.dtype or 'unknown'}, which no "
            "v2 datatype carries",
        )
    got = t.get("datatype")
    if got != want:
        raise RequestError(
            400, f"input {name!r}: datatype {str(got)[:20]!r}, but model {model!r} expects {want}"
        )
    shape = _shape(t.get("shape"), spec, model)
    count = math.prod(shape)
    dtype = np.dtype(object) if want == "BYTES" else datatypes()[want]
    checked = TensorSpec(name, dtype, spec.shape)
    params = _obj(t.get("parameters"), f"input {name!r}: parameters")
    _unsupported(params, f"input {name!r}")
    has_data = "data" in t
    size = params.get("binary_data_size")
    if size is None:
        if not has_data:
            raise RequestError(
                400,
                f'input {name!r}: no data: send "data", or binary data with '
                '"parameters": {"binary_data_size": n}',
            )
        return TensorIn(checked, dtype, want, shape, count, data=t["data"])
    if has_data:
        raise RequestError(400, f'input {name!r}: both "data" and binary_data_size')
    if not binary:
        raise RequestError(
            400,
            f"input {name!r}: binary_data_size without an Inference-Header-Content-Length "
            "header (the length of the JSON part)",
        )
    size = _uint(size, f"input {name!r}: binary_data_size", 2**63)
    if want == "BYTES":
        if size < 4 * count:
            raise RequestError(
                400,
                f"input {name!r}: binary_data_size {size} is too small for {count} BYTES "
                "elements (4 bytes of length each, at least)",
            )
    elif size != count * dtype.itemsize:
        raise RequestError(
            400,
            f"input {name!r}: binary_data_size {size}, but shape {list(shape)} of {want} is "
            f"{count * dtype.itemsize} bytes",
        )
    return TensorIn(checked, dtype, want, shape, count, binary_size=size)


def _shape(value: Any, spec: TensorSpec, model: str) -> tuple[int, ...]:
    """A request's shape checked: a list of ints in range, the model's rank and dims."""
    name = spec.name
    if not isinstance(value, list) or len(value) > MAX_TENSOR_RANK:
        raise RequestError(
            400, f'input {name!r}: "shape" must be a list of at most {MAX_TENSOR_RANK} ints'
        )
    for d in value:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise RequestError(
                400, f"input {name!r}: shape {str(value)[:100]}: dims are integers >= 0"
            )
        if d >= 2**62:
            raise RequestError(
                400, f"input {name!r}: shape {str(value)[:100]}: dim {str(d)[:30]} is too "
                "large (dims are below 2**62)",
            )  # fmt: skip
    if math.prod(max(d, 1) for d in value) >= 2**62:
        raise RequestError(
            400, f"input {name!r}: shape {str(value)[:200]}: its dims multiply to 2**62 or more"
        )
    want = spec.shape
    if want is not None and (
        len(value) != len(want) or any(isinstance(w, int) and w != d for d, w in zip(value, want))
    ):
        raise RequestError(
            400,
            f"input {name!r}: shape {value}, but model {model!r} expects "
            f"{metadata_shape(want)} (-1: any size)",
        )
    return tuple(value)


def _parse_outputs(
    value: Any, model: str, specs: Sequence[TensorSpec], binary_default: bool, dense: set[str]
) -> list[tuple[str, bool]]:
    """The outputs asked for, (name, binary?) in order; adds to ``dense`` the ones asked
    for with ``"dense": true``."""
    names = [s.name for s in specs]
    if value is None:
        return [(n, binary_default) for n in names]
    if not isinstance(value, list):
        raise RequestError(400, '"outputs" must be a list of {"name": ...} objects')
    wanted: list[tuple[str, bool]] = []
    for i, o in enumerate(value):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise RequestError(400, f'outputs[{i}] must be an object with a string "name"')
        name = o["name"]
        if name not in names:
            raise RequestError(
                400,
                f"unknown output {name[:100]!r} for model {model!r}; its outputs are "
                f"{names_list(names)}",
            )
        if any(n == name for n, _ in wanted):
            raise RequestError(400, f"output {name!r} is asked for more than once")
        params = _obj(o.get("parameters"), f"output {name!r}: parameters")
        _unsupported(params, f"output {name!r}")
        if params.get("classification"):
            raise RequestError(400, f"output {name!r}: classification is not supported")
        flag = params.get("binary_data", binary_default)
        wanted.append((name, _flag(flag, f"output {name!r}: parameters.binary_data")))
        if _flag(params.get("dense", False), f"output {name!r}: parameters.dense"):
            dense.add(name)
    return wanted


def tensor_from_json(t: TensorIn) -> np.ndarray:
    """A JSON input's ``data`` (flat row-major, or nested as its shape) as an array of its
    shape; data nested otherwise (``[[1, 2], [3, 4]]`` for shape [4]) is a 400."""
    arr = convert_value(t.spec, t.data)
    if arr.ndim > 1 and arr.shape != tuple(t.shape):
        raise RequestError(
            400,
            f'input {t.spec.name!r}: "data" is nested as {list(arr.shape)}, but the shape is '
            f"{list(t.shape)}; give it flat (row-major) or nested as the shape",
        )
    if arr.size != t.count:
        raise RequestError(
            400,
            f"input {t.spec.name!r}: shape {list(t.shape)} holds {t.count} elements, but "
            f'"data" has {arr.size}',
        )
    return arr.reshape(t.shape)


def json_data(name: str, arr: np.ndarray) -> list[Any] | np.ndarray:
    """An output's values as the flat row-major list of a JSON response: numbers as a
    flat array (``json_pieces.dumps`` writes it as a list, in pieces when large)."""
    if arr.dtype.kind != "O":
        return arr.ravel()
    flat = arr.ravel().tolist()
    if arr.dtype.kind == "O":
        for i, v in enumerate(flat):
            if isinstance(v, bytes):
                try:
                    flat[i] = v.decode("utf-8")
                except UnicodeDecodeError:
                    raise RequestError(
                        400,
                        f"output {name!r} holds bytes that are not UTF-8; ask for it with "
                        '"parameters": {"binary_data": true}',
                    ) from None
            elif not isinstance(v, str):
                flat[i] = str(v)
    return flat
