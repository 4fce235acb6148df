"""Kernels keep their per-shape plans in a bounded memo (kernels/common.py ``ShapeMemo``):
a model with free spatial dims fed ever-new sizes -- a stranger's requests -- does not
grow them without bound, and still answers right."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.kernels.common import ShapeMemo


def test_put_empties_a_full_memo_first() -> None:
    memo: ShapeMemo[int, str] = ShapeMemo(cap=3)
    assert [memo.put(k, str(k)) for k in range(3)] == ["0", "1", "2"]
    assert memo.get(1) == "1" and len(memo) == 3
    assert memo.put(3, "3") == "3"
    assert dict(memo) == {3: "3"}


def test_decided_remembers_a_decline_and_makes_each_plan_once() -> None:
    memo: ShapeMemo[int, Any] = ShapeMemo(cap=8)
    made: list[int] = []

    def make(k: int) -> Any:
        made.append(k)
        return None if k == 0 else (False if k == 1 else f"plan {k}")

    for _ in range(2):
        assert [memo.decided(k, make, k) for k in range(3)] == [None, None, "plan 2"]
    assert made == [0, 1, 2]  # declines stored too: nothing made again
    assert memo[0] is False and memo[1] is False


def _model() -> Any:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["m"], ["y"], kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_ever_new_spatial_sizes_keep_every_kernels_memo_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memos: list[ShapeMemo[Any, Any]] = []
    init = ShapeMemo.__init__

    def recording_init(self: ShapeMemo[Any, Any], cap: int = 8) -> None:
        init(self, 8)  # a small cap, so that 60 sizes overflow it several times
        memos.append(self)

    monkeypatch.setattr(ShapeMemo, "__init__", recording_init)
    m = _model()
    model = tfrt_py.load(m, executor="sync")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    for i in range(60):
        x = rng.standard_normal((1, 3, 8 + i, 9 + (i * 7) % 23)).astype(np.float32)
        got = model.run({"x": x})["y"]
        if i % 10 == 0 or i == 59:
            np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert memos, "no kernel keeps a ShapeMemo"
    assert max(len(memo) for memo in memos) <= 8
    assert any(len(memo) > 0 for memo in memos)
