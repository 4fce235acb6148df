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
    return _one_node_model(node, width, "probabilities")


def _one_node_model(node: Any, width: int, scores: str) -> bytes:
    graph = helper.make_graph(
        [node], "svc", [helper.make_tensor_value_info("X", F, ["N", width])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, None),
         helper.make_tensor_value_info(scores, F, None)],
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
@pytest.mark.compiles
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
@pytest.mark.compiles
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


def _decision_svc(kernel: str, vpc: list[int], width: int, seed: int) -> bytes:
    """A one-vs-one SVC without probabilities (its scores are the pairwise decision
    values), ``vpc`` support vectors per class (a 0 allowed)."""
    rng = np.random.default_rng(seed)
    classes, n_sv = len(vpc), sum(vpc)
    n_pairs = classes * (classes - 1) // 2
    node = helper.make_node(
        "SVMClassifier", ["X"], ["label", "scores"], domain="ai.onnx.ml",
        classlabels_ints=list(range(classes)), kernel_type=kernel,
        kernel_params=[0.3, 0.5, 3.0], vectors_per_class=vpc,
        support_vectors=rng.standard_normal(n_sv * width).tolist(),
        coefficients=rng.uniform(-1, 1, (classes - 1) * n_sv).tolist(),
        rho=rng.uniform(-0.3, 0.3, n_pairs).tolist(),
    )  # fmt: skip
    return _one_node_model(node, width, "scores")


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("kernel", ["SIGMOID", "LINEAR", "RBF"])
@pytest.mark.parametrize("vpc", [[40, 25, 31], [12, 0, 9, 20, 7, 15], [30, 44]])
@pytest.mark.compiles
def test_decision_values_are_onnxruntimes(
    executor: str, kernel: str, vpc: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pairwise decision values: SIGMOID's ``tanh(gamma k + coef0)`` as MLAS computes it
    (the scale and offset one fused multiply-add, its rational tanh; libm's tanh left a
    quarter of the scores up to 1.1e-5 off), and the native tier's sums four pairs at a time
    (six classes: 15 pairs, a last block of three, a class with no vectors)."""
    if executor == "native":
        monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    data = _decision_svc(kernel, vpc, 10, seed=len(vpc) * 10 + vpc[0])
    model = tfrt_py.load(data, executor=executor, native="eager")
    if executor == "native":
        assert model.native is not None and model.native.state == "ready", model.describe()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = (np.random.default_rng(5).standard_normal((400, 10)) * 1.5).astype(np.float32)
    got = model.run({"X": x})
    want_label, want = sess.run(None, {"X": x})
    np.testing.assert_array_equal(got["label"], want_label)
    np.testing.assert_allclose(got["scores"], want, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not available(), reason="numba is not installed")
def test_negative_vectors_per_class_are_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count below zero (here 20, -10, 3: a class would start past the last vector) is
    declined by the native tier, whose sums run over the classes' vector ranges."""
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    data = _decision_svc("LINEAR", [20, -10, 3], 4, seed=1)
    with pytest.raises(tfrt_py.errors.TfrtError, match="vectors_per_class"):
        tfrt_py.load(data, executor="native", native="eager")
