"""``fuse_qtable``: a quantized SiLU (com.microsoft QLinearMul of x and QLinearSigmoid(x),
either operand order; QLinearLeakyRelu too) becomes one ``tfrt_py.fused::QTable`` lookup
whose codes are the unfused kernels' codes, for every one of the 256 inputs; a pair whose
f(x) has another reader, or a product of f(x) with another tensor, stays; against
onnxruntime within one unit (its vectorized QLinearMul rounds a few products the other
way)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.jit_paths import (  # noqa: F401 - both_paths, autouse: compiled and NumPy
    both_paths,
)
from tfrt_py.compiler.pipeline import PASSES

MS = "com.microsoft"
_ELEM = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def _model(dt: Any, op: str, x_first: bool, extra_reader: bool, other: bool) -> onnx.ModelProto:
    """x -> op(x) = s -> QLinearMul(x, s) (or (s, x)), every scale and zero point an
    initializer; ``extra_reader``: s is a graph output too; ``other``: the product is of
    s and a second input instead of x."""
    lo = 0 if dt == np.uint8 else -128
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
        numpy_helper.from_array(np.array(lo + 100, dt), "xz"),
        numpy_helper.from_array(np.array(1 / 256, np.float32), "ss"),
        numpy_helper.from_array(np.array(lo, dt), "sz"),
        numpy_helper.from_array(np.array(0.03, np.float32), "ys"),
        numpy_helper.from_array(np.array(lo + 20, dt), "yz"),
    ]
    attrs: dict[str, Any] = {"alpha": 0.1} if op == "QLinearLeakyRelu" else {}
    nodes = [helper.make_node(op, ["x", "xs", "xz", "ss", "sz"], ["s"], domain=MS, **attrs)]
    a = ["x2" if other else "x", "xs", "xz"]
    b = ["s", "ss", "sz"]
    mul_in = (a + b if x_first else b + a) + ["ys", "yz"]
    nodes.append(helper.make_node("QLinearMul", mul_in, ["y"], domain=MS, name="silu"))
    inputs = [helper.make_tensor_value_info("x", _ELEM[dt], [1, 256])]
    if other:
        inputs.append(helper.make_tensor_value_info("x2", _ELEM[dt], [1, 256]))
    outputs = [helper.make_tensor_value_info("y", _ELEM[dt], [1, 256])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("s", _ELEM[dt], [1, 256]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 9
    return model


def _every_code(dt: Any) -> np.ndarray:
    return np.arange(256, dtype=np.int64).astype(np.uint8).view(dt).reshape(1, 256)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("x_first", [True, False])
def test_a_quantized_silu_is_one_lookup_with_the_unfused_codes(
    dt: Any, op: str, x_first: bool
) -> None:
    model = _model(dt, op, x_first, extra_reader=False, other=False)
    x = _every_code(dt)
    unfused = tfrt_py.load(model, optimize=set(PASSES) - {"fuse_qtable"})
    want = unfused.run({"x": x})["y"]
    for ex in ("sync", "async"):
        m = tfrt_py.load(model, executor=ex)
        report = m.describe()
        assert "fuse_qtable: 1 quantized SiLUs" in report, report
        assert "tfrt_py.fused::QTable x1" in report and "QLinearMul" not in report.split(
            "ops as loaded")[0], report  # fmt: skip
        got = m.run({"x": x})["y"]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})[0]
    assert np.abs(want.astype(np.int64) - ref.astype(np.int64)).max() <= 1


@pytest.mark.parametrize(("extra_reader", "other"), [(True, False), (False, True)])
def test_pairs_that_are_not_a_silu_stay(extra_reader: bool, other: bool) -> None:
    model = _model(np.uint8, "QLinearSigmoid", True, extra_reader, other)
    m = tfrt_py.load(model)
    assert "fuse_qtable: nothing to fuse" in m.describe()
    feeds = {"x": _every_code(np.uint8)}
    if other:
        feeds["x2"] = _every_code(np.uint8)[:, ::-1].copy()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, ref in zip(m.run(feeds).values(), sess.run(None, feeds)):
        assert np.abs(got.astype(np.int64) - ref.astype(np.int64)).max() <= 1
