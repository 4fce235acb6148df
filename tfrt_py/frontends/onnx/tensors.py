"""ONNX TensorProto / TypeProto -> NumPy arrays and IR types.

External data is memory-mapped read-only from its file (``np.memmap``), not copied. The
file is opened only through ``external.open_external`` (inside the model's directory, a
regular file, no symlinks); a refused location, a missing file, one too short for the
tensor, bad dims or a bad offset/length is a ModelLoadError naming the tensor.
``external_ref`` makes the same checks without touching the bytes: it records where a
tensor lives (file, offset, length, dtype, shape) for the streaming loader, which reads
it later into its own buffers (``tfrt_py.streaming``).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import ModelLoadError
from ...ir import OpaqueType, OptionalType, SequenceType, TensorType, ValueType
from ...ir.dtypes import numpy_dtype
from .external import open_external

__all__ = [
    "MAX_TENSOR_BYTES",
    "ExternalRef",
    "external_ref",
    "is_external",
    "onnx_dtype",
    "tensor_shape",
    "to_array",
    "to_value_type",
]


def onnx_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX TensorProto element type (object for STRING)."""
    try:
        return numpy_dtype(elem_type)
    except ValueError as e:
        raise ModelLoadError(f"unsupported ONNX element type {elem_type}") from e


def to_value_type(tp: onnx.TypeProto) -> ValueType | None:
    """Convert an ONNX TypeProto; ``None`` when the proto carries no type."""
    which = tp.WhichOneof("value")
    if which == "tensor_type" or which == "sparse_tensor_type":
        tt = tp.tensor_type if which == "tensor_type" else tp.sparse_tensor_type
        dtype = onnx_dtype(tt.elem_type) if tt.elem_type else None
        if not tt.HasField("shape"):
            return TensorType(dtype, None)
        dims: list[int | str | None] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        return TensorType(dtype, tuple(dims))
    if which == "sequence_type":
        return SequenceType(to_value_type(tp.sequence_type.elem_type))
    if which == "optional_type":
        return OptionalType(to_value_type(tp.optional_type.elem_type))
    if which == "map_type":  # named by its types (enums, never model text)
        mt = tp.map_type
        key = onnx_dtype(mt.key_type).name if mt.key_type else "?"
        value = to_value_type(mt.value_type)
        return OpaqueType(f"map<{'string' if key == 'object' else key},{value}>")
    return None


def to_array(t: onnx.TensorProto, base_dir: str | None) -> np.ndarray:
    """The tensor's data. External data is memory-mapped from ``base_dir`` (None: the
    model has no directory, so external data is a ModelLoadError saying to pass one).
    Bad dims (``tensor_shape``) are a ModelLoadError naming the tensor."""
    if is_external(t):
        return _external(t, base_dir)
    tensor_shape(t)
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise ModelLoadError(f"tensor {t.name!r} cannot be read: {e}") from e
    if arr.dtype.kind == "U" or arr.dtype.kind == "S":
        arr = arr.astype(object)
    if arr.dtype == object:
        arr = np.vectorize(_decode, otypes=[object])(arr) if arr.size else arr
    return arr


#: The largest byte size a tensor may declare: NumPy's limit (``np.intp``), int64 here.
MAX_TENSOR_BYTES = (1 << 63) - 1


def tensor_shape(t: onnx.TensorProto) -> tuple[int, ...]:
    """``t``'s dims, checked: each >= 0, and the tensor's byte size (nonzero dims times the
    item size) representable in int64. Else a ModelLoadError naming the tensor: a negative
    or overflowing dim would otherwise surface as a raw OverflowError/ValueError from NumPy
    or wrap around silently in ``np.prod``."""
    shape = tuple(int(d) for d in t.dims)
    if any(d < 0 for d in shape):
        raise ModelLoadError(f"tensor {t.name!r}: negative dim in shape {list(shape)}")
    try:
        size = onnx_dtype(t.data_type).itemsize if t.data_type else 1
    except ModelLoadError:
        size = 1  # an unknown element type fails where the data is converted
    for d in shape:
        size *= d or 1
    if size > MAX_TENSOR_BYTES:
        raise ModelLoadError(
            f"tensor {t.name!r}: shape {list(shape)} declares more than 2**63 bytes"
        )
    return shape


def _decode(v: Any) -> Any:
    return v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else v


@dataclass(frozen=True)
class ExternalRef:
    """Where an external-data tensor's bytes live: ``nbytes`` little-endian bytes of
    ``dtype`` at ``offset`` in the file ``location`` inside ``base_dir`` (``path``: the
    absolute path, as checked at load). Immutable; made at load. Whoever opens the file
    later opens it with ``external.open_external(base_dir, location, name)``, which checks
    it again."""

    name: str
    path: str
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]
    base_dir: str = ""
    location: str = ""


def is_external(t: onnx.TensorProto) -> bool:
    """Whether ``t``'s data lives in an external file."""
    return t.data_location == onnx.TensorProto.EXTERNAL


def external_ref(t: onnx.TensorProto, base_dir: str | None) -> ExternalRef:
    """Check and record where ``t``'s external data lives, without reading it.

    Raises ModelLoadError naming the tensor when ``base_dir`` is None (a bytes or proto
    source without ``load(base_dir=)``), the location is refused (``external.open_external``:
    absolute, ``..``, symlinks, outside the directory, not a regular file), the dims are
    bad, ``offset``/``length`` are not non-negative integers, ``length`` differs from the
    tensor's declared size, or the file is too short for ``offset + nbytes``.
    """
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if base_dir is None:
        raise ModelLoadError(
            f"tensor {t.name!r} has external data (location {location!r}) but the model was "
            "not loaded from a file, so there is no directory to read it from: pass "
            "load(..., base_dir=DIR), the directory its locations are relative to"
        )
    dtype = onnx_dtype(t.data_type)
    if dtype.kind == "O":
        raise ModelLoadError(f"tensor {t.name!r}: string tensors cannot be external data")
    shape = tensor_shape(t)
    nbytes = math.prod(shape) * dtype.itemsize
    offset = _int_field(t.name, info, "offset", 0)
    length = _int_field(t.name, info, "length", nbytes)
    if length != nbytes:
        raise ModelLoadError(
            f"tensor {t.name!r}: external data length {length} does not match the "
            f"{nbytes} bytes its dims {list(shape)} declare"
        )
    fd, path = open_external(base_dir, location, t.name)
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if offset > size or nbytes > size - offset:
        raise ModelLoadError(
            f"tensor {t.name!r}: external data file {location!r} is too short "
            f"(needs {nbytes} bytes at offset {offset}, file has {size})"
        )
    le = dtype if sys.byteorder == "little" else dtype.newbyteorder("<")  # ONNX data is LE
    return ExternalRef(t.name, path, offset, nbytes, le, shape, os.path.abspath(base_dir),
                       location)  # fmt: skip


def _int_field(name: str, info: dict[str, str], key: str, default: int) -> int:
    raw = info.get(key)
    if raw is None:
        return default
    text = raw.strip()
    if not text.isdigit() or not text.isascii():
        raise ModelLoadError(
            f"tensor {name!r}: external data {key} {raw!r} is not a non-negative integer"
        )
    return int(text)


def _external(t: onnx.TensorProto, base_dir: str | None) -> np.ndarray:
    ref = external_ref(t, base_dir)
    if ref.nbytes == 0:
        return np.zeros(ref.shape, ref.dtype)
    fd, _ = open_external(ref.base_dir, ref.location, ref.name)
    with os.fdopen(fd, "rb") as f:  # the mapping keeps its own reference to the file
        mm = np.memmap(f, dtype=ref.dtype, mode="r", offset=ref.offset, shape=ref.shape)
    return np.asarray(mm)  # a plain ndarray view; the mapping stays alive through .base
