"""What an ONNX TensorProto declares, checked, without its data: its NumPy dtype, its
dims (sizes representable in int64), whether the data is external. Shared by
``tensors`` (which reads the data) and ``external_ref`` (which locates external data)."""

from __future__ import annotations

import numpy as np
import onnx

from ...errors import ModelLoadError
from ...ir.dtypes import numpy_dtype

__all__ = ["MAX_TENSOR_BYTES", "is_external", "onnx_dtype", "tensor_shape", "uses_external_data"]


def onnx_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX TensorProto element type (object for STRING)."""
    try:
        return numpy_dtype(elem_type)
    except ValueError as e:
        raise ModelLoadError(f"unsupported ONNX element type {elem_type}") from e


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


def is_external(t: onnx.TensorProto) -> bool:
    """Whether ``t``'s data lives in an external file."""
    return t.data_location == onnx.TensorProto.EXTERNAL


def uses_external_data(model: onnx.ModelProto) -> bool:
    """Whether any tensor of ``model`` -- an initializer, a sparse initializer, a tensor
    attribute, in any graph or model-local function -- keeps its data in an external file.
    Iterative: the importer has bounded the nesting by the time this runs."""
    graphs: list[onnx.GraphProto] = [model.graph]
    nodes: list[onnx.NodeProto] = [n for f in model.functions for n in f.node]
    while graphs or nodes:
        if graphs:
            g = graphs.pop()
            if any(map(is_external, g.initializer)) or any(
                map(_external_sparse, g.sparse_initializer)
            ):
                return True
            nodes.extend(g.node)
            continue
        for a in nodes.pop().attribute:
            if (a.HasField("t") and is_external(a.t)) or any(map(is_external, a.tensors)):
                return True
            if _external_sparse(a.sparse_tensor) or any(map(_external_sparse, a.sparse_tensors)):
                return True
            if a.HasField("g"):
                graphs.append(a.g)
            graphs.extend(a.graphs)
    return False


def _external_sparse(sp: onnx.SparseTensorProto) -> bool:
    return is_external(sp.values) or is_external(sp.indices)
