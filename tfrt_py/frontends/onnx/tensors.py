"""ONNX TensorProto / TypeProto -> NumPy arrays and IR types.

External data is memory-mapped read-only from its file (``np.memmap``), not copied. The
file is opened only through ``external.open_external`` (inside the model's directory, a
regular file, no symlinks); a refused location, a missing file, one too short for the
tensor, bad dims or a bad offset/length is a ModelLoadError naming the tensor.
``external_ref.external_ref`` makes the same checks without touching the bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import ModelLoadError
from ...ir import OpaqueType, OptionalType, SequenceType, TensorType, ValueType
from .tensor_meta import MAX_TENSOR_BYTES, is_external, onnx_dtype, tensor_shape

__all__ = [
    "MAX_TENSOR_BYTES",
    "is_external",
    "onnx_dtype",
    "tensor_shape",
    "to_array",
    "to_value_type",
]


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
        from .external_ref import read_external  # here: most models have no external data

        return read_external(t, base_dir)
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


def _decode(v: Any) -> Any:
    return v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else v
