"""Value types of the IR: tensors with static or symbolic dims, sequences, optionals."""

from __future__ import annotations

import numpy as np

from ..records import record

#: One dimension: a static size, a symbolic name (``"batch"``), or ``None`` (unknown).
Dim = int | str | None


@record(frozen=True, slots=True)
class TensorType:
    """A tensor's element type and shape.

    ``dtype`` is a NumPy dtype (object for ONNX strings) or ``None`` when unknown.
    ``shape`` is a tuple of dims, or ``None`` when even the rank is unknown.
    """

    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        dt = "?" if self.dtype is None else self.dtype.name
        if dt == "object":
            dt = "string"
        if self.shape is None:
            return f"{dt}[*]"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{dt}[{dims}]"


@record(frozen=True, slots=True)
class SequenceType:
    """An ONNX sequence of values of one element type."""

    elem: ValueType | None = None

    def __str__(self) -> str:
        return f"seq<{self.elem}>"


@record(frozen=True, slots=True)
class OptionalType:
    """An ONNX optional: holds a value of ``elem`` or nothing."""

    elem: ValueType | None = None

    def __str__(self) -> str:
        return f"optional<{self.elem}>"


@record(frozen=True, slots=True)
class OpaqueType:
    """Anything else (maps from ai.onnx.ml ZipMap, unknown types)."""

    name: str = "opaque"

    def __str__(self) -> str:
        return self.name


ValueType = TensorType | SequenceType | OptionalType | OpaqueType


def tensor_type(dtype: object, shape: tuple[Dim, ...] | list[Dim] | None = None) -> TensorType:
    """Make a TensorType from anything ``np.dtype`` accepts and a shape sequence."""
    return TensorType(
        None if dtype is None else np.dtype(dtype),  # type: ignore[call-overload]
        None if shape is None else tuple(shape),
    )
