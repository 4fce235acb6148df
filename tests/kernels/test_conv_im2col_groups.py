"""The NumPy path's one-group conv makes its im2col columns a group of images at a time
(``conv.IM2COL_GROUP_BYTES``): groups of one, two and a partial last group give
onnxruntime's result, with and without pads and strides, a bias and a fused ReLU. The
conv is float64 and the compiled kernels are switched off ($TFRT_PY_JIT=0)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.kernels.lib.jit import ENV_JIT
from tfrt_py.kernels.nn import conv


def _model(w: np.ndarray, b: np.ndarray, attrs: dict[str, Any], relu: bool, dt: int) -> bytes:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", dt, ["n", 3, 9, 9])],
        [helper.make_tensor_value_info("y", dt, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("images_a_group", [1, 2, 5])
@pytest.mark.parametrize(
    ("attrs", "relu"),
    [({"pads": [1, 1, 1, 1]}, False), ({"strides": [2, 2]}, True),
     ({"pads": [0, 1, 2, 1], "dilations": [2, 1]}, True)],
)  # fmt: skip
def test_groups_of_images_match_onnxruntime(
    monkeypatch: pytest.MonkeyPatch, images_a_group: int, attrs: dict[str, Any], relu: bool
) -> None:
    rng = np.random.default_rng(images_a_group)
    w = rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal(4)
    data = _model(w, b, attrs, relu, TensorProto.DOUBLE)
    x = rng.standard_normal((5, 3, 9, 9))
    # onnxruntime has no float64 Conv: the same conv in float32
    f32 = _model(w.astype(np.float32), b.astype(np.float32), attrs, relu, TensorProto.FLOAT)
    sess = ort.InferenceSession(f32, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x.astype(np.float32)})[0]
    out_pixels = want.shape[2] * want.shape[3]
    monkeypatch.setattr(conv, "IM2COL_GROUP_BYTES", images_a_group * 27 * out_pixels * 8)
    seen: list[int] = []
    groups = conv._im2col_groups

    def spy(w2: np.ndarray, view: np.ndarray, plan: object, res: np.ndarray) -> np.ndarray:
        seen.append(view.shape[0])
        return groups(w2, view, plan, res)  # type: ignore[arg-type]

    monkeypatch.setattr(conv, "_im2col_groups", spy)
    monkeypatch.setenv(ENV_JIT, "0")  # the blocked route (compiled) serves it otherwise
    model = tfrt_py.load(data, executor="sync")
    for n in (5, 3, 1):
        got = model.run({"x": x[:n]})["y"]
        np.testing.assert_allclose(got, want[:n], rtol=1e-5, atol=1e-5)
    # the calls of several images took the groups (a call's rows may be split over threads)
    assert seen and max(seen) > 1
