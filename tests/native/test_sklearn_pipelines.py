"""scikit-learn estimators a user meets beyond the zoo's (AdaBoost, CalibratedClassifierCV
with sigmoid or isotonic calibration, a Normalizer before a nearest-neighbour scan) run on
the tiers they were built for and give onnxruntime's answers: a variadic Sum/Max/Min lowers
natively, an isotonic calibrator's lookup becomes a per-row Gather (``fuse_ml``), and the
Normalizer's output is typed so the KNN scan after it is fused."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.ort_agreement import assert_matches_onnxruntime
from tfrt_py.native import available

pytest.importorskip("skl2onnx", reason="the scikit-learn models are converted by skl2onnx")

native = pytest.mark.skipif(not available(), reason="numba is not installed")


def _convert(est: Any, x: np.ndarray) -> bytes:
    from skl2onnx import to_onnx

    onx = to_onnx(est, x[:1], options={id(est): {"zipmap": False}},
                  target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip
    return onx.SerializeToString()


def _data() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=400, n_features=8, n_informative=6, n_classes=3, random_state=0
    )
    return x.astype(np.float32), y


def _estimator(kind: str) -> Any:
    from sklearn import calibration, ensemble, linear_model, neighbors, pipeline, preprocessing

    if kind == "adaboost":
        return ensemble.AdaBoostClassifier(n_estimators=8, random_state=0)
    if kind.startswith("calibrated"):
        method = kind.split()[1]
        return calibration.CalibratedClassifierCV(linear_model.LogisticRegression(),
                                                  method=method, cv=3)  # fmt: skip
    return pipeline.make_pipeline(preprocessing.Normalizer(), neighbors.KNeighborsClassifier())


@native
@pytest.mark.slow  # ~45 s: three boxes of a hundred nodes compiled from nothing
@pytest.mark.parametrize("kind", ["adaboost", "calibrated sigmoid", "calibrated isotonic"])
def test_ensembles_and_calibrators_run_native(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    x, y = _data()
    data = _convert(_estimator(kind).fit(x, y), x)
    model = tfrt_py.load(data, executor="native", native="eager")
    assert_matches_onnxruntime(model, data, x[:1] + 0.05, x[:50] + 0.05)


def test_a_normalized_knn_scan_is_fused() -> None:
    x, y = _data()
    data = _convert(_estimator("normalizer knn").fit(x, y), x)
    model = tfrt_py.load(data, executor="sync")
    assert "PairwiseSqDist" in model.describe()
    assert_matches_onnxruntime(model, data, x[:1] + 0.05, x[:50] + 0.05)


@native
@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
@pytest.mark.parametrize("count", [1, 3, 4])
@pytest.mark.compiles
def test_variadic_elementwise_ops_lower_natively(
    op: str, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In input order, broadcast together (a row, a column, a scalar), NaN propagated."""
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    shapes: list[list[Any]] = [["N", 5], [1, 5], ["N", 1], [1]]
    shapes = shapes[:count]
    names = [f"x{i}" for i in range(count)]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"])], "variadic",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = tfrt_py.load(data.SerializeToString(), executor="native", native="eager")
    rng = np.random.default_rng(count)
    feeds = {}
    for n, s in zip(names, shapes):
        dims = [7 if d == "N" else d for d in s]
        feeds[n] = (rng.standard_normal(dims) * 1e3).astype(np.float32)
    feeds["x0"][2, 3] = np.nan
    want = ort.InferenceSession(data.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(model.run(feeds)["y"], want.run(None, feeds)[0])


@native
@pytest.mark.compiles
def test_many_tree_ensembles_compile_their_kernels_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ensemble's scratch sits at its own arena offset; passed as int64, not as a
    literal, so numba compiles the tree kernels once, not once an ensemble."""
    from sklearn import ensemble

    from tfrt_py.native.kernels import trees

    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    x, y = _data()
    est = ensemble.AdaBoostClassifier(n_estimators=4, random_state=0).fit(x, y)
    data = _convert(est, x)
    kernels = (trees.forest_leq, trees.forest_lt, trees.forest_mixed, trees.tree_cls_finish)
    before = [len(k.signatures) for k in kernels]
    model = tfrt_py.load(data, executor="native", native="eager")
    assert_matches_onnxruntime(model, data, x[:1], x[:20])
    grown = [len(k.signatures) - b for k, b in zip(kernels, before, strict=True)]
    assert max(grown) <= 1, grown
