"""LinearClassifier (logistic regression's export) against onnxruntime: every post
transform, one coefficient row (onnxruntime's binary form) and several, int and string
labels, NaN rows, on the compiled one-pass kernel (small products) and NumPy's path (and
big products, which stay on BLAS); the compiled pass really runs where it should."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.jit_paths import compiled_only, spy_compiled
from tfrt_py.kernels.ml import linear_jit

ML = "ai.onnx.ml"


def _model(classes: int, features: int, transform: str, labels: Any, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    attrs: dict[str, Any] = {
        "coefficients": rng.standard_normal(classes * features).tolist(),
        "intercepts": rng.standard_normal(classes).tolist(),
        "post_transform": transform,
    }
    if labels and isinstance(labels[0], str):
        attrs["classlabels_strings"] = labels
        out_type = TensorProto.STRING
    else:
        attrs["classlabels_ints"] = labels
        out_type = TensorProto.INT64
    node = helper.make_node("LinearClassifier", ["X"], ["label", "scores"], domain=ML, **attrs)
    g = helper.make_graph(
        [node], "lc", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("label", out_type, None),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)],
    )  # fmt: skip
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)]
    )
    return m.SerializeToString()


CASES = [
    (1, [0, 1]), (1, ["no", "yes"]), (2, [0, 1]), (4, [3, 5, 7, 9]), (3, ["a", "b", "c"]),
]  # fmt: skip


@pytest.mark.parametrize(("classes", "labels"), CASES)
@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_matches_onnxruntime(classes: int, labels: Any, transform: str, jit: str) -> None:
    if classes == 1 and transform.startswith("SOFTMAX"):
        pytest.skip("onnxruntime's binary form has no softmax of one score")
    data = _model(classes, 6, transform, labels, seed=classes)
    model = tfrt_py.load(data)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for rows in (1, 5, 4000):  # 4000 x 6 x C: past the compiled pass's size, BLAS
        x = (rng.standard_normal((rows, 6)) * 3).astype(np.float32)
        x[0] = 0.0  # a score of exactly the intercept
        if rows > 1:
            x[1, 2] = np.nan
        want_label, want_scores = sess.run(None, {"X": x})
        got = model.run({"X": x})
        np.testing.assert_array_equal(got["label"], want_label)
        np.testing.assert_allclose(got["scores"], want_scores, rtol=1e-5, atol=1e-6)


def test_small_products_take_the_compiled_pass(monkeypatch: pytest.MonkeyPatch, jit: str) -> None:
    calls = spy_compiled(monkeypatch, linear_jit, "linear_classifier")
    model = tfrt_py.load(_model(3, 6, "SOFTMAX", [0, 1, 2], seed=1))
    before = len(calls)
    model.run({"X": np.ones((2, 6), np.float32)})
    assert len(calls) - before == (1 if jit == "jit" else 0)
    model.run({"X": np.ones((4000, 6), np.float32)})  # 72k multiply-adds: BLAS
    assert len(calls) - before == (1 if jit == "jit" else 0)


@compiled_only
@pytest.mark.parametrize("mode", [linear_jit.MULTI | linear_jit.SOFTMAX, linear_jit.MULTI,
                                  linear_jit.BINARY | linear_jit.LOGISTIC])  # fmt: skip
def test_rows_four_at_a_time_give_the_bits_of_one_at_a_time(mode: int) -> None:
    """The compiled pass sums four rows' scores at once (four independent chains), each in
    the one-row loop's order: the same float32 bits as the rows one by one (the tail's
    loop), NaN rows included."""
    fn = linear_jit.linear_classifier()
    rng = np.random.default_rng(7)
    c = 1 if mode & linear_jit.BINARY else 3
    x = (rng.standard_normal((11, 20)) * 3).astype(np.float32)
    x[5, 3] = np.nan
    w = rng.standard_normal((c, 20)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    width = 2 if mode & linear_jit.BINARY else c
    idx, scores = np.empty(11, np.int64), np.empty((11, width), np.float32)
    fn(x, w, b, mode, idx, scores)
    for i in range(11):
        one_idx, one = np.empty(1, np.int64), np.empty((1, width), np.float32)
        fn(x[i : i + 1], w, b, mode, one_idx, one)
        assert one_idx[0] == idx[i]
        np.testing.assert_array_equal(one[0], scores[i])
