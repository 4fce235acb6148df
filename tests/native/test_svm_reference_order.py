"""SVMs give onnxruntime's values, on the native tier and in the interpreter.

An SVC's probabilities: its RBF distances summed in float32 over the features in order with
a correctly rounded ``exp``, its decision values summed in float64, and libsvm's pairwise
coupling in float32 in onnxruntime's order. The coupling stops at a tolerance of 0.005 /
classes, so its small probabilities hang on the last bits of every step: in another order
(float32 decision sums, float64 coupling, a fused multiply-add where LLVM finds one) they
came out 6e-5 relative from onnxruntime's. The other kernels' values and a regressor's sum:
one fused multiply-add chain, as MLAS's gemm."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.ort_agreement import assert_matches_onnxruntime
from tfrt_py.native import available

F = TensorProto.FLOAT


def _svc(classes: int, per_class: int, width: int, seed: int) -> bytes:
    """A one-vs-one RBF SVC with probabilities, libsvm's layout, random but plausible."""
    rng = np.random.default_rng(seed)
    n_sv = classes * per_class
    n_pairs = classes * (classes - 1) // 2
    node = helper.make_node(
        "SVMClassifier", ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
        classlabels_ints=list(range(classes)), kernel_type="RBF",
        kernel_params=[0.04, 0.0, 3.0], vectors_per_class=[per_class] * classes,
        support_vectors=(rng.standard_normal(n_sv * width) * 2).tolist(),
        coefficients=rng.uniform(-1, 1, (classes - 1) * n_sv).tolist(),
        rho=rng.uniform(-0.3, 0.3, n_pairs).tolist(),
        prob_a=rng.uniform(-6, -2, n_pairs).tolist(),
        prob_b=rng.uniform(-0.2, 0.2, n_pairs).tolist(),
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "svc", [helper.make_tensor_value_info("X", F, ["N", width])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, None),
         helper.make_tensor_value_info("probabilities", F, None)],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


EXECUTORS = [
    "sync",
    pytest.param(
        "native", marks=pytest.mark.skipif(not available(), reason="numba is not installed")
    ),
]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("classes, per_class, width", [(3, 120, 20), (5, 40, 9), (2, 150, 30)])
def test_svc_probabilities_are_onnxruntimes(
    executor: str, classes: int, per_class: int, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if executor == "native":
        monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    data = _svc(classes, per_class, width, seed=classes * 100 + width)
    model = tfrt_py.load(data, executor=executor, native="eager")
    if executor == "native":
        assert model.native is not None and model.native.state == "ready", model.describe()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for n in (1, 300):
        x = (np.random.default_rng(n + width).standard_normal((n, width)) * 2).astype(np.float32)
        got = model.run({"X": x})
        want_label, want = sess.run(None, {"X": x})
        np.testing.assert_array_equal(got["label"], want_label)
        p = np.asarray(got["probabilities"])
        # the same bits but where a float32 rounding lands on the other side of a tie
        assert np.mean(p == want) > 0.5, (executor, n)
        np.testing.assert_allclose(p, want, rtol=1e-5, atol=1e-7)


def _fitted(kind: str) -> tuple[bytes, np.ndarray]:
    """A scikit-learn SVM converted by skl2onnx, and rows near its training data."""
    from skl2onnx import to_onnx
    from sklearn import svm
    from sklearn.datasets import make_classification, make_regression

    x, y = make_classification(
        n_samples=500, n_features=12, n_informative=8, n_classes=4, random_state=0
    )
    xr, yr = make_regression(n_samples=300, n_features=12, random_state=0)
    est: Any
    if kind.startswith("SVC"):
        est = svm.SVC(kernel=kind.split()[1], probability=True, random_state=0).fit(x, y)
    elif kind.startswith("SVR"):
        est, x = svm.SVR(kernel=kind.split()[1]).fit(xr, yr), xr
    else:
        est, x = svm.OneClassSVM(gamma="scale").fit(xr), xr
    x = x.astype(np.float32)
    options = {id(est): {"zipmap": False}} if kind.startswith("SVC") else None
    onx = to_onnx(est, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
    noise = np.random.default_rng(1).standard_normal((200, 12)).astype(np.float32) * 0.3
    return onx.SerializeToString(), x[:200] + noise


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize(
    "kind", ["SVC linear", "SVC poly", "SVC sigmoid", "SVR rbf", "SVR poly", "OneClassSVM"]
)
def test_other_svms_match_onnxruntime(
    executor: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other kernels' values as MLAS's gemm sums them (one fused multiply-add chain),
    a regressor's sum over its support vectors likewise, and a OneClassSVM's Sign on the
    native tier."""
    pytest.importorskip("skl2onnx", reason="the scikit-learn models are converted by skl2onnx")
    if executor == "native":
        monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    data, x = _fitted(kind)
    model = tfrt_py.load(data, executor=executor, native="eager")
    if executor == "native":
        assert model.native is not None and model.native.state == "ready", model.describe()
    assert_matches_onnxruntime(model, data, x)


@pytest.mark.skipif(not available(), reason="numba is not installed")
def test_sign_lowers_as_numpy_signs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sign (a OneClassSVM's last op) on the native tier: NumPy's values, +0.0 for -0.0,
    NaN kept."""
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    graph = helper.make_graph(
        [helper.make_node("Sign", ["X"], ["Y"])], "sign",
        [helper.make_tensor_value_info("X", F, ["N"])],
        [helper.make_tensor_value_info("Y", F, None)],
    )  # fmt: skip
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = tfrt_py.load(data.SerializeToString(), executor="native", native="eager")
    x = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, -2.5, 3e-39, -1e-45], np.float32)
    got = np.asarray(model.run({"X": x})["Y"])
    np.testing.assert_array_equal(got, np.sign(x))
    assert not np.signbit(got[0])
