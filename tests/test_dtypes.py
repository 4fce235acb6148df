"""tfrt_py.ir.dtypes, the one ONNX element type -> NumPy dtype table, and its two users'
errors (a kernel's load-time UnsupportedOpError, the frontend's ModelLoadError)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tfrt_py.errors import ModelLoadError, UnsupportedOpError
from tfrt_py.frontends.onnx.tensors import onnx_dtype
from tfrt_py.ir import Node, Value
from tfrt_py.ir.dtypes import ElemType, is_sub_byte, numpy_dtype
from tfrt_py.kernels import KernelContext

_CODES = [v for k, v in TensorProto.DataType.items() if k != "UNDEFINED"]


@pytest.mark.parametrize("code", _CODES, ids=lambda c: TensorProto.DataType.Name(c))
def test_table_matches_onnx(code: int) -> None:
    assert numpy_dtype(code) == np.dtype(helper.tensor_dtype_to_np_dtype(code))
    assert ElemType(code).name == TensorProto.DataType.Name(code)


def test_names_and_int_likes() -> None:
    assert numpy_dtype("FLOAT") == np.float32
    assert numpy_dtype("double") == np.float64
    assert numpy_dtype(np.int64(7)) == np.int64
    assert numpy_dtype(ElemType.STRING) == np.dtype(object)
    assert numpy_dtype(ElemType.BFLOAT16).name == "bfloat16"


@pytest.mark.parametrize("bad", [0, 99, -1, "FLOAT33", "", None, 1.5j])
def test_unknown_types_are_value_errors(bad: object) -> None:
    with pytest.raises(ValueError):
        numpy_dtype(bad)


def test_sub_byte_types() -> None:
    sub = {t for t in ElemType if is_sub_byte(numpy_dtype(t))}
    E = ElemType
    assert sub == {E.INT4, E.UINT4, E.INT2, E.UINT2, E.FLOAT4E2M1}


def test_kernel_error_names_the_attribute_and_node() -> None:
    ctx = KernelContext(Node("Cast", [Value("x")], [Value("y")], {"to": 99}, name="c"))
    assert ctx.elem_dtype(10, "to") == np.float16
    with pytest.raises(UnsupportedOpError, match=r"at node 'c': to=99 has no NumPy dtype"):
        ctx.elem_dtype(99, "to")


def test_frontend_error_is_a_load_error() -> None:
    assert onnx_dtype(TensorProto.FLOAT16) == np.float16
    with pytest.raises(ModelLoadError, match="unsupported ONNX element type 0"):
        onnx_dtype(TensorProto.UNDEFINED)
    assert onnx.TensorProto.STRING == ElemType.STRING
