"""ONNX TensorProto / TypeProto -> NumPy arrays and IR types.

External data is memory-mapped read-only from its file (``np.memmap``), not copied; a
missing file or one too short for the tensor is a ModelLoadError naming the tensor.
``external_ref`` makes the same checks without touching the bytes: it records where a
tensor lives (file, offset, length, dtype, shape) for the streaming loader, which reads
it later into its own buffers (``tfrt_py.streaming``).
"""

from __future__ import annotations

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

__all__ = ["ExternalRef", "external_ref", "is_external", "onnx_dtype", "to_array", "to_value_type"]


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
    if which == "map_type":
        return OpaqueType("map")
    return None


def to_array(t: onnx.TensorProto, base_dir: str) -> np.ndarray:
    """The tensor's data. External data is memory-mapped from ``base_dir``."""
    if is_external(t):
        return _external(t, base_dir)
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise ModelLoadError(f"tensor {t.name!r} cannot be read: {e}") from e
    if arr.dtype.kind == "U" or arr.dtype.kind == "S":
        arr = arr.astype(object)
    if arr.dtype == object:
        arr = np.vectorize(_decode, otypes=[object])(arr) if arr.size else arr
    return arr


def _decode(v: Any) -> Any:
    return v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else v


@dataclass(frozen=True)
class ExternalRef:
    """Where an external-data tensor's bytes live: ``nbytes`` little-endian bytes of
    ``dtype`` at ``offset`` in the file ``path`` (absolute). Immutable; made at load."""

    name: str
    path: str
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]


def is_external(t: onnx.TensorProto) -> bool:
    """Whether ``t``'s data lives in an external file."""
    return t.data_location == onnx.TensorProto.EXTERNAL


def external_ref(t: onnx.TensorProto, base_dir: str) -> ExternalRef:
    """Check and record where ``t``'s external data lives, without reading it.

    Raises ModelLoadError naming the tensor when the location is missing, the file does not
    exist, or the file is too short for ``offset + nbytes`` (or ``length`` < nbytes).
    """
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location")
    if not location:
        raise ModelLoadError(f"tensor {t.name!r}: external data without a location")
    path = os.path.abspath(os.path.join(base_dir, location))
    if not os.path.isfile(path):
        raise ModelLoadError(f"tensor {t.name!r}: external data file not found: {path}")
    dtype = onnx_dtype(t.data_type)
    if dtype.kind == "O":
        raise ModelLoadError(f"tensor {t.name!r}: string tensors cannot be external data")
    shape = tuple(int(d) for d in t.dims)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        offset = int(info.get("offset", 0))
        length = int(info.get("length", nbytes))
    except ValueError as e:
        raise ModelLoadError(f"tensor {t.name!r}: bad external data offset/length: {e}") from e
    size = os.path.getsize(path)
    if offset < 0 or length < nbytes or offset + nbytes > size:
        raise ModelLoadError(
            f"tensor {t.name!r}: external data file {location!r} is too short "
            f"(needs {nbytes} bytes at offset {offset}, file has {size})"
        )
    le = dtype if sys.byteorder == "little" else dtype.newbyteorder("<")  # ONNX data is LE
    return ExternalRef(t.name, path, offset, nbytes, le, shape)


def _external(t: onnx.TensorProto, base_dir: str) -> np.ndarray:
    ref = external_ref(t, base_dir)
    if ref.nbytes == 0:
        return np.zeros(ref.shape, ref.dtype)
    mm = np.memmap(ref.path, dtype=ref.dtype, mode="r", offset=ref.offset, shape=ref.shape)
    return np.asarray(mm)  # a plain ndarray view; the mapping stays alive through .base
