"""A LinearClassifier's rows all at once in rows mode's tiles (a ``grouped`` lowering: the
LLVM IR kernel's sums, ``kernels.linear_ir.linear_cls_rows_ir``, where it runs here, else
``kernels.svm.linear_cls_rows``): each row's label and scores are the bits the one-row
body gives it, and onnxruntime's labels and scores."""

from __future__ import annotations

import numpy as np
import pytest

import tfrt_py
from tfrt_py.kernels.lib import linear_rows_ir

pytest.importorskip("numba", reason="the native tier needs numba")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")

ML = "ai.onnx.ml"
T = 64  # native.lower.rows_source.TILE_ROWS


def _model(n_features: int, n_coef_rows: int, labels: list[int], transform: str,
           seed: int) -> bytes:  # fmt: skip
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    node = helper.make_node(
        "LinearClassifier", ["X"], ["L", "Y"], domain=ML,
        coefficients=rng.standard_normal(n_coef_rows * n_features).astype(np.float32).tolist(),
        intercepts=rng.standard_normal(n_coef_rows).astype(np.float32).tolist(),
        classlabels_ints=labels, post_transform=transform,
    )  # fmt: skip
    width = 2 if n_coef_rows == 1 and len(labels) == 2 else n_coef_rows
    g = helper.make_graph(
        [node], "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, n_features])],
        [helper.make_tensor_value_info("L", TensorProto.INT64, [None]),
         helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, width])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 1)])  # fmt: skip
    m.ir_version = 9
    return m.SerializeToString()


CASES = {
    "3 classes NONE": (20, 3, [0, 1, 2], "NONE"),
    "5 classes SOFTMAX": (7, 5, [3, 1, 4, 1, 5], "SOFTMAX"),
    "4 classes LOGISTIC": (33, 4, [0, 1, 2, 3], "LOGISTIC"),
    "binary, two labels, LOGISTIC": (12, 1, [4, 9], "LOGISTIC"),
    "binary, two labels, NONE": (5, 1, [0, 1], "NONE"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.compiles
def test_classifier_rows_at_once_match_the_one_row_body_and_onnxruntime(case: str) -> None:
    f, k, labels, transform = CASES[case]
    data = _model(f, k, labels, transform, seed=len(case))
    model = tfrt_py.load(data, executor="native", native="eager")
    assert model.native.form == "rows"
    grouped = "linear_cls_rows_ir(" if linear_rows_ir.kernel() is not None else "linear_cls_rows("
    assert grouped in model.native.lowered.source  # the tile's grouped call
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2 * T + 7, f)).astype(np.float32)
    x[5, 0] = np.nan  # a NaN row: the first largest is NaN's class, as onnxruntime's
    got = model.run({"X": x})
    lab, y = sess.run(None, {"X": x})
    np.testing.assert_array_equal(got["L"], lab)
    np.testing.assert_allclose(got["Y"], y, rtol=1e-5, atol=1e-6)
    for r in (0, 3, 5, T - 1, T, 2 * T + 6):  # a row alone runs the one-row body
        one = model.run({"X": x[r : r + 1]})
        assert one["L"][0] == got["L"][r]
        np.testing.assert_array_equal(one["Y"][0], got["Y"][r], err_msg=f"row {r}")


def _regressor(n_features: int, targets: int, transform: str, seed: int) -> bytes:
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    node = helper.make_node(
        "LinearRegressor", ["X"], ["Y"], domain=ML, targets=targets,
        coefficients=rng.standard_normal(targets * n_features).astype(np.float32).tolist(),
        intercepts=rng.standard_normal(targets).astype(np.float32).tolist(),
        post_transform=transform,
    )  # fmt: skip
    g = helper.make_graph(
        [node], "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, n_features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, targets])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 1)])  # fmt: skip
    m.ir_version = 9
    return m.SerializeToString()


@pytest.mark.parametrize("targets", [1, 3])
@pytest.mark.compiles
def test_regressor_rows_four_at_a_time_match_the_one_row_body_and_onnxruntime(
    targets: int,
) -> None:
    data = _regressor(20, targets, "NONE", seed=targets)
    model = tfrt_py.load(data, executor="native", native="eager")
    assert "linear_reg_rows(" in model.native.lowered.source
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(9).standard_normal((2 * T + 3, 20)).astype(np.float32)
    got = model.run({"X": x})["Y"]
    np.testing.assert_allclose(got, sess.run(None, {"X": x})[0], rtol=1e-5, atol=1e-5)
    for r in (0, 2, T, 2 * T + 2):
        np.testing.assert_array_equal(model.run({"X": x[r : r + 1]})["Y"][0], got[r])


def _liblinear_svm(n_features: int, classes: int, seed: int) -> bytes:
    """An SVMClassifier in liblinear mode (no support vectors: a coefficient row per class
    and one rho), as ``ai.onnx.ml`` allows."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    node = helper.make_node(
        "SVMClassifier", ["X"], ["L", "Y"], domain=ML, kernel_type="LINEAR",
        coefficients=rng.standard_normal(classes * n_features).astype(np.float32).tolist(),
        rho=[0.25], classlabels_ints=list(range(classes)), kernel_params=[0.1, 0.0, 3.0],
    )  # fmt: skip
    g = helper.make_graph(
        [node], "svm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, n_features])],
        [helper.make_tensor_value_info("L", TensorProto.INT64, [None]),
         helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, classes])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 1)])  # fmt: skip
    m.ir_version = 9
    return m.SerializeToString()


@pytest.mark.parametrize("case", ["3 classes NONE", "binary, two labels, LOGISTIC", "liblinear"])
@pytest.mark.compiles
def test_the_ir_kernel_and_the_numba_loop_give_the_same_bits(case: str, monkeypatch) -> None:
    """The grouped rows on the IR kernel (where this host runs it) and on the numba loop
    (the packed kernels switched off) give the same labels and scores, and the liblinear
    SVM's rows onnxruntime's."""
    if linear_rows_ir.kernel() is None:
        pytest.skip("the IR kernel does not run here: only the numba loop")
    if case == "liblinear":
        data = _liblinear_svm(17, 3, seed=3)
    else:
        f, k, labels, transform = CASES[case]
        data = _model(f, k, labels, transform, seed=len(case))
    x = np.random.default_rng(11).standard_normal((3 * T + 5, 17 if case == "liblinear" else
                                                  CASES[case][0])).astype(np.float32)  # fmt: skip
    x[4, 1] = np.nan
    ir = tfrt_py.load(data, executor="native", native="eager")
    assert "linear_cls_rows_ir(" in ir.native.lowered.source
    monkeypatch.setenv("TFRT_PY_PACKED_GEMM", "0")
    loop = tfrt_py.load(data, executor="native", native="eager")
    assert "linear_cls_rows(" in loop.native.lowered.source
    a, b = ir.run({"X": x}), loop.run({"X": x})
    for name in ("L", "Y"):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    if case == "liblinear":
        lab, y = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x})
        np.testing.assert_array_equal(a["L"], lab)
        np.testing.assert_allclose(a["Y"], y, rtol=1e-5, atol=1e-6)


@pytest.mark.compiles
def test_a_classifier_of_very_many_classes_keeps_the_loops_small_scratch() -> None:
    """Classes beyond ``linear_rows_ir.MAX_CLASSES`` would make the IR route's scratch (64
    rows of sums) large: such a model takes the numba loop (eight rows of scratch), and
    its labels and scores are onnxruntime's."""
    k = linear_rows_ir.MAX_CLASSES + 1
    data = _model(2, k, list(range(k)), "NONE", seed=5)
    model = tfrt_py.load(data, executor="native", native="eager")
    assert "linear_cls_rows(" in model.native.lowered.source
    assert "linear_cls_rows_ir(" not in model.native.lowered.source
    x = np.random.default_rng(2).standard_normal((T + 3, 2)).astype(np.float32)
    lab, y = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    got = model.run({"X": x})
    np.testing.assert_array_equal(got["L"], lab)
    np.testing.assert_allclose(got["Y"], y, rtol=1e-5, atol=1e-6)
