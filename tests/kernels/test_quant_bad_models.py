"""Quantized models with bad constants are refused at load with a ``tfrt_py.errors``
exception naming the node (issue 36): a scale that is zero, negative or not finite, or
per-axis scales and zero points of the wrong length; QuantizeLinear/DequantizeLinear with a
constant scale of zero or not finite. Without the checks these ran to a
wrong answer (a zero scale gave the output zero point everywhere)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import tfrt_py
from tfrt_py.errors import ModelLoadError


def _conv(xs: Any = 0.02, ws: Any = None, wz: Any = None, ys: Any = 0.1) -> onnx.ModelProto:
    co = 4
    ws = np.full(co, 0.01, np.float32) if ws is None else np.asarray(ws, np.float32)
    inits = [
        nh.from_array(np.array(xs, np.float32), "xs"), nh.from_array(np.array(3, np.uint8), "xz"),
        nh.from_array(np.ones((co, 3, 3, 3), np.int8), "w"), nh.from_array(ws, "ws"),
        nh.from_array(np.zeros(co, np.int8) if wz is None else wz, "wz"),
        nh.from_array(np.array(ys, np.float32), "ys"), nh.from_array(np.array(5, np.uint8), "yz"),
    ]  # fmt: skip
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"],
                            name="the_conv", pads=[1, 1, 1, 1])  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.UINT8, None)
    g = helper.make_graph([node], "g", [x], [y], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _matmul(bs: Any) -> onnx.ModelProto:
    inits = [
        nh.from_array(np.array(0.02, np.float32), "as"), nh.from_array(np.array(3, np.uint8), "az"),
        nh.from_array(np.ones((6, 4), np.int8), "b"),
        nh.from_array(np.asarray(bs, np.float32), "bs"),
        nh.from_array(np.array(0, np.int8), "bz"), nh.from_array(np.array(0.1, np.float32), "ys"),
        nh.from_array(np.array(5, np.uint8), "yz"),
    ]  # fmt: skip
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"],
                            name="the_matmul")  # fmt: skip
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 6])
    y = helper.make_tensor_value_info("y", TensorProto.UINT8, None)
    m = helper.make_model(helper.make_graph([node], "g", [a], [y], initializer=inits),
                          opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    m.ir_version = 9
    return m


@pytest.mark.parametrize(
    "kw,why",
    [
        ({"ws": [0.01, 0.0, 0.01, 0.01]}, "positive and finite"),
        ({"ws": [0.01, np.nan, 0.01, 0.01]}, "positive and finite"),
        ({"xs": np.inf}, "positive and finite"),
        ({"xs": -0.5}, "positive and finite"),
        ({"ys": 0.0}, "positive and finite"),
        ({"ws": [0.01] * 3}, "3 values"),
        ({"wz": np.zeros(2, np.int8)}, "2 values"),
    ],
)
def test_a_bad_qlinearconv_is_refused_at_load(kw: dict[str, Any], why: str) -> None:
    with pytest.raises(ModelLoadError, match=why) as e:
        tfrt_py.load(_conv(**kw))
    assert "the_conv" in str(e.value)


@pytest.mark.parametrize(
    "bs,why", [([0.01, 0.0, 0.01, 0.01], "positive"), ([0.01] * 3, "3 values")]
)
def test_a_bad_qlinearmatmul_is_refused_at_load(bs: Any, why: str) -> None:
    with pytest.raises(ModelLoadError, match=why) as e:
        tfrt_py.load(_matmul(bs))
    assert "the_matmul" in str(e.value)


@pytest.mark.compiles
def test_good_constants_still_load_and_run() -> None:
    m = tfrt_py.load(_conv())
    y = m.run({"x": np.full((1, 3, 5, 5), 3, np.uint8)})["y"]
    assert y.shape == (1, 4, 5, 5) and (y == 5).all()  # x at its zero point: y at its own
    out = tfrt_py.load(_matmul([0.01] * 4)).run({"a": np.full((2, 6), 3, np.uint8)})["y"]
    assert (out == 5).all()


def _qdq(op: str, scale: Any) -> onnx.ModelProto:
    x_type = TensorProto.FLOAT if op == "QuantizeLinear" else TensorProto.UINT8
    inits = [nh.from_array(np.asarray(scale, np.float32), "s"),
             nh.from_array(np.array(3, np.uint8), "z")]  # fmt: skip
    node = helper.make_node(op, ["x", "s", "z"], ["y"], name="the_qdq", axis=1)
    x = helper.make_tensor_value_info("x", x_type, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)
    m = helper.make_model(helper.make_graph([node], "g", [x], [y], initializer=inits),
                          opset_imports=[helper.make_opsetid("", 19)])  # fmt: skip
    m.ir_version = 9
    return m


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
@pytest.mark.parametrize("scale", [0.0, np.nan, -np.inf, [0.1, 0.0, 0.2]])
def test_a_qdq_with_a_zero_or_non_finite_scale_is_refused_at_load(op: str, scale: Any) -> None:
    with pytest.raises(ModelLoadError, match="nonzero and finite") as e:
        tfrt_py.load(_qdq(op, scale))
    assert "the_qdq" in str(e.value)


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
def test_a_qdq_with_good_scales_runs(op: str) -> None:
    m = tfrt_py.load(_qdq(op, [0.5, 0.25, 2.0]))
    x = np.array([[3, 4, 5], [1, 2, 3]], np.float32 if op == "QuantizeLinear" else np.uint8)
    y = m.run({"x": x})["y"]
    if op == "QuantizeLinear":
        assert y.dtype == np.uint8 and y.tolist() == [
            [9, 19, 5],
            [5, 11, 5],
        ]  # 2.5 and 1.5 round to even
    else:
        assert y.tolist() == [[0.0, 0.25, 4.0], [-1.0, -0.25, 0.0]]
