"""ONNX element types -> NumPy dtypes: the one table tfrt_py keeps.

ONNX names a tensor's element type by a ``TensorProto.DataType`` code: a TensorProto's
``data_type``, a TypeProto's ``elem_type``, and attributes such as Cast's ``to``, EyeLike's
``dtype`` or QuantizeLinear's ``output_dtype``. The IR and the kernels use NumPy dtypes.
``numpy_dtype`` maps a code (or its ONNX name, as Cast-1 spells it: ``"FLOAT"``) to the
dtype; the frontend and every kernel go through it (``elem_type`` is the way back, for
the import cache's files). NumPy's own types are looked up without importing ml_dtypes.

The codes and names are ONNX's own (``onnx/onnx.proto``), kept here so that the IR does not
import onnx; a test checks the table against ``onnx.helper.tensor_dtype_to_np_dtype``.
STRING is ``object`` (arrays of Python ``str``). bfloat16, the float8/float6/float4 types
and int4/uint4/int2/uint2 are ml_dtypes types (ml_dtypes comes with onnx), imported on
first use so that ``import tfrt_py`` stays cheap. Thread-safe: the table is built once
(``functools.cache``) and never mutated.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

import numpy as np

__all__ = ["ElemType", "elem_type", "is_sub_byte", "numpy_dtype"]


class ElemType(enum.IntEnum):
    """ONNX ``TensorProto.DataType`` codes, by their ONNX names."""

    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28


#: Element types NumPy has natively, by NumPy dtype name.
_NUMPY: dict[ElemType, str] = {
    ElemType.FLOAT: "float32",
    ElemType.UINT8: "uint8",
    ElemType.INT8: "int8",
    ElemType.UINT16: "uint16",
    ElemType.INT16: "int16",
    ElemType.INT32: "int32",
    ElemType.INT64: "int64",
    ElemType.STRING: "object",
    ElemType.BOOL: "bool",
    ElemType.FLOAT16: "float16",
    ElemType.DOUBLE: "float64",
    ElemType.UINT32: "uint32",
    ElemType.UINT64: "uint64",
    ElemType.COMPLEX64: "complex64",
    ElemType.COMPLEX128: "complex128",
}
#: Element types ml_dtypes provides, by ml_dtypes attribute name.
_ML_DTYPES: dict[ElemType, str] = {
    ElemType.BFLOAT16: "bfloat16",
    ElemType.FLOAT8E4M3FN: "float8_e4m3fn",
    ElemType.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    ElemType.FLOAT8E5M2: "float8_e5m2",
    ElemType.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    ElemType.UINT4: "uint4",
    ElemType.INT4: "int4",
    ElemType.FLOAT4E2M1: "float4_e2m1fn",
    ElemType.FLOAT8E8M0: "float8_e8m0fnu",
    ElemType.UINT2: "uint2",
    ElemType.INT2: "int2",
    ElemType.FLOAT6E2M3: "float6_e2m3fn",
    ElemType.FLOAT6E3M2: "float6_e3m2fn",
}
#: The 2- and 4-bit types: ml_dtypes stores them one per byte, so they cannot be bit-cast.
_SUB_BYTE = frozenset(
    _ML_DTYPES[t]
    for t in (
        ElemType.UINT4,
        ElemType.INT4,
        ElemType.FLOAT4E2M1,
        ElemType.UINT2,
        ElemType.INT2,
    )
)


@functools.cache
def _native() -> dict[int, np.dtype]:
    """The types NumPy has itself: looked up without importing ml_dtypes."""
    return {int(t): np.dtype(name) for t, name in _NUMPY.items()}


@functools.cache
def _table() -> dict[int, np.dtype]:
    table = dict(_native())
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - onnx depends on ml_dtypes
        return table
    for t, name in _ML_DTYPES.items():
        table[int(t)] = np.dtype(getattr(ml_dtypes, name))
    return table


def numpy_dtype(elem_type: int | str | Any) -> np.dtype:
    """The NumPy dtype of ONNX element type ``elem_type``: a ``TensorProto.DataType`` code
    (any int-like) or its ONNX name in any case (``"FLOAT"``, ``"float16"``).

    Raises ``ValueError`` for UNDEFINED (0), unknown codes and names, and types NumPy
    cannot hold; callers turn it into their own error (a load error, an unsupported op).
    """
    if isinstance(elem_type, str):
        try:
            code = int(ElemType[elem_type.upper()])
        except KeyError:
            raise ValueError(f"{elem_type!r} is not an ONNX element type name") from None
    else:
        try:
            code = int(elem_type)
        except (TypeError, ValueError):
            raise ValueError(f"{elem_type!r} is not an ONNX element type") from None
    dt = _native().get(code)
    if dt is None:
        dt = _table().get(code)
    if dt is None:
        raise ValueError(f"ONNX element type {elem_type!r} has no NumPy dtype")
    return dt


@functools.cache
def _by_dtype_name() -> dict[str, ElemType]:
    return {name: t for table in (_NUMPY, _ML_DTYPES) for t, name in table.items()}


def elem_type(dt: np.dtype) -> ElemType | None:
    """The ONNX element type of NumPy dtype ``dt`` (by name: ml_dtypes is not imported),
    or None for a dtype ONNX has no type for. ``numpy_dtype`` is its inverse."""
    return _by_dtype_name().get(dt.name)


def is_sub_byte(dt: np.dtype) -> bool:
    """True for the 2- and 4-bit types (stored one per byte by ml_dtypes, not bit-castable)."""
    return dt.name in _SUB_BYTE
