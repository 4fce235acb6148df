"""Overridable initializers: an initializer that is also declared a graph input.

ONNX (IR >= 4) lets the caller override such an initializer by feeding the input; before
IR 4 every initializer had to be listed as an input, so the listing means nothing and the
initializer is a constant. tfrt_py does what onnxruntime does: the name is not among
``model.inputs`` (nothing the caller must feed) but among
``model.overridable_initializers``; a call that feeds it uses the fed value, a call that
does not uses the initializer. The importer makes it a graph input whose ``Value.default``
is the initializer, so no load-time pass folds through it; ``feeds.FeedChecker`` fills the
default in when the feed is missing.
"""

from __future__ import annotations

import onnx

from ...errors import ModelLoadError
from ...ir import TensorType, Value
from .tensors import to_array, to_value_type

__all__ = ["defaulted_input", "overridable_initializers"]


def overridable_initializers(model: onnx.ModelProto) -> frozenset[str]:
    """Main-graph initializers the caller may override: those also declared as graph inputs,
    in ONNX IR >= 4 (before IR 4 every initializer had to be declared an input, and such an
    input is just a constant). onnxruntime's ``get_overridable_initializers``."""
    if model.ir_version < 4:
        return frozenset()
    declared = {vi.name for vi in model.graph.input}
    return frozenset(t.name for t in model.graph.initializer if t.name in declared)


def defaulted_input(t: onnx.TensorProto, vi: onnx.ValueInfoProto, base_dir: str | None) -> Value:
    """The graph input for overridable initializer ``t`` declared as ``vi``: typed as
    declared (the initializer's type where the declaration says less), its data the
    read-only default. A declaration that contradicts the data is a ModelLoadError."""
    arr = to_array(t, base_dir)
    arr.flags.writeable = False
    declared = to_value_type(vi.type)
    dtype, shape = arr.dtype, tuple(arr.shape)
    if isinstance(declared, TensorType) and declared.dtype is not None and declared.dtype != dtype:
        raise ModelLoadError(
            f"initializer {t.name!r} is {arr.dtype} but its graph input declares {declared.dtype}"
        )
    if isinstance(declared, TensorType) and declared.shape is not None:
        dims = declared.shape
        if len(dims) != len(shape) or any(
            isinstance(d, int) and d != n for d, n in zip(dims, shape)
        ):
            raise ModelLoadError(
                f"initializer {t.name!r} has shape {list(shape)} but its graph input declares "
                f"{list(dims)}"
            )
        v = Value(t.name, TensorType(dtype, dims))
    else:
        v = Value(t.name, TensorType(dtype, shape))
    v.default = arr
    return v
