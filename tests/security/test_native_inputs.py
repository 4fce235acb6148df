"""Feeds and dtypes the native tier must not get wrong (issue 12): big-endian feeds of
every rank (numba read a 0-d one as native-endian: 0.5 came back as 8.8e-44), and models
whose constants, outputs or intermediates have dtypes the lowering does not know (a raw
``KeyError: 'uint8'`` escaped from load)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.errors import TfrtError

RANKS = [(), (3,), (2, 3), (1, 2, 3)]


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)


def _unary(op: str, elem: int, shape: tuple[int, ...]) -> bytes:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])],
        "unary",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", elem, list(shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("executor", ["native", "sync"])
@pytest.mark.parametrize("shape", RANKS, ids=lambda s: f"rank{len(s)}")
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_big_endian_feeds(executor: str, shape: tuple[int, ...], dtype: str) -> None:
    floats = dtype == "float32"
    op, elem = ("Relu", TensorProto.FLOAT) if floats else ("Identity", TensorProto.INT64)
    model = tfrt_py.load(_unary(op, elem, shape), executor=executor, native="eager")
    assert model.executor == executor
    x = (np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) - 1) * 3
    if floats:
        x = x + np.float32(0.5)
    x = np.asarray(x, dtype)  # 0-d arithmetic gave a NumPy scalar
    want = np.maximum(x, 0) if op == "Relu" else x
    swapped = x.astype(x.dtype.newbyteorder(">" if np.little_endian else "<"))
    for feed in [x, swapped, swapped, x, swapped]:  # after ordinary calls, too
        got = model.run({"x": feed})["y"]
        assert got.dtype == np.dtype(dtype) and got.dtype.isnative, got.dtype
        np.testing.assert_array_equal(got, want)


UNKNOWN = ["int16", "uint16", "float16", "uint32"]
#: 8-bit values lower (quantized models' codes), but no float is cast to them natively
EIGHT_BIT = ["uint8", "int8"]


def _with_dtype(dtype: str, where: str) -> bytes:
    """Relu(x) -> z, plus a value of ``dtype``: a constant graph output (``const``), or an
    intermediate (x cast to ``dtype`` and back, ``intermediate``)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Relu", ["x"], ["z"])]
    outputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])]
    if where == "const":
        c = numpy_helper.from_array(np.array([1, 2], dtype))
        nodes.append(helper.make_node("Constant", [], ["c"], value=c))
        outputs.append(helper.make_tensor_value_info("c", elem, [2]))
    else:
        nodes += [
            helper.make_node("Cast", ["x"], ["t"], to=elem),
            helper.make_node("Cast", ["t"], ["back"], to=TensorProto.FLOAT),
        ]
        outputs.append(helper.make_tensor_value_info("back", TensorProto.FLOAT, [2]))
    graph = helper.make_graph(
        nodes, "dtypes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], outputs
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("dtype", EIGHT_BIT)
def test_eight_bit_values_lower_but_float_casts_to_them_decline(dtype: str) -> None:
    """A constant 8-bit output is served by the native tier with its dtype and values; a
    float cast to 8 bits (undefined out of range in ONNX, wrapping in NumPy) declines, and
    the interpreter serves it."""
    native = tfrt_py.load(_with_dtype(dtype, "const"), executor="native", native="eager")
    out = native.run({"x": np.array([-1.5, 2.0], np.float32)})
    assert out["c"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out["c"], np.array([1, 2], dtype))
    np.testing.assert_array_equal(out["z"], [0.0, 2.0])
    with pytest.raises(TfrtError, match="Cast float32"):
        tfrt_py.load(_with_dtype(dtype, "intermediate"), executor="native", native="eager")


@pytest.mark.parametrize("where", ["const", "intermediate"])
@pytest.mark.parametrize("dtype", UNKNOWN)
def test_unknown_dtypes_decline(dtype: str, where: str) -> None:
    data = _with_dtype(dtype, where)
    auto = tfrt_py.load(data, native="eager")
    assert auto.executor == "sync"
    assert "native tier: not used" in auto.describe()
    x = np.array([-1.5 if where == "const" else 0.5, 2.0], np.float32)
    out = auto.run({"x": x})
    np.testing.assert_array_equal(out["z"], np.maximum(x, 0))
    if where == "const":
        assert out["c"].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out["c"], np.array([1, 2], dtype))
    else:
        np.testing.assert_array_equal(out["back"], x.astype(dtype).astype(np.float32))
    with pytest.raises(TfrtError) as e:
        tfrt_py.load(data, executor="native", native="eager")
    assert not isinstance(e.value, KeyError)
