"""A sweep of scikit-learn estimators and pipelines beyond the classic zoo (issue 39: "every
skl2onnx converter a user is likely to meet"), each fitted from a fixed seed on synthetic
data, converted by skl2onnx, and run by tfrt_py ``auto`` and onnxruntime side by side.

Per estimator: the executor auto serves after warming; whether every output is
onnxruntime's (labels equal, floats within 1e-5 relative / 1e-6 absolute) on the native
tier and on the sync interpreter; then batch 1 and batch 1000 timed interleaved in one
process (medians; onnxruntime without spinning, as ``benchmarks/zoo.py``: its pool threads
would otherwise spin on the cores of the next burst). Estimators skl2onnx cannot convert,
or that do not fit the data, are listed as such.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. python benchmarks/sklearn_sweep.py
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np


def estimators() -> dict[str, tuple[Callable[[], Any], str]]:
    """name -> (a fresh estimator, which data: "clf", "bin", "pos", "reg" or "none")."""
    from sklearn import (
        calibration,
        cluster,
        cross_decomposition,
        decomposition,
        ensemble,
        feature_selection,
        linear_model,
        mixture,
        naive_bayes,
        neighbors,
        neural_network,
        pipeline,
        random_projection,
        svm,
        tree,
    )
    from sklearn import discriminant_analysis as da
    from sklearn import preprocessing as pp

    lr = linear_model.LogisticRegression
    return {
        "LogisticRegression": (lambda: lr(max_iter=500), "clf"),
        "LogisticRegression binary": (lambda: lr(), "bin"),
        "RidgeClassifier": (linear_model.RidgeClassifier, "clf"),
        "Perceptron": (linear_model.Perceptron, "clf"),
        "PassiveAggressive": (linear_model.PassiveAggressiveClassifier, "clf"),
        "BernoulliNB": (naive_bayes.BernoulliNB, "clf"),
        "ComplementNB": (naive_bayes.ComplementNB, "pos"),
        "KNN distance": (lambda: neighbors.KNeighborsClassifier(weights="distance"), "clf"),
        "LDA": (da.LinearDiscriminantAnalysis, "clf"),
        "ExtraTrees": (lambda: ensemble.ExtraTreesClassifier(20, random_state=0), "clf"),
        "GradientBoosting binary": (
            lambda: ensemble.GradientBoostingClassifier(n_estimators=20, random_state=0), "bin"),
        "AdaBoost": (lambda: ensemble.AdaBoostClassifier(n_estimators=20, random_state=0), "clf"),
        "Bagging": (lambda: ensemble.BaggingClassifier(n_estimators=5, random_state=0), "clf"),
        "Stacking": (lambda: ensemble.StackingClassifier(
            [("a", lr()), ("b", tree.DecisionTreeClassifier(max_depth=4))]), "clf"),
        "Calibrated sigmoid": (
            lambda: calibration.CalibratedClassifierCV(lr(), method="sigmoid", cv=3), "clf"),
        "Calibrated isotonic": (
            lambda: calibration.CalibratedClassifierCV(lr(), method="isotonic", cv=3), "clf"),
        "MLPRegressor": (lambda: neural_network.MLPRegressor(
            hidden_layer_sizes=(32,), max_iter=300, random_state=0), "reg"),
        "DecisionTreeRegressor": (lambda: tree.DecisionTreeRegressor(max_depth=6), "reg"),
        "GradientBoostingRegressor": (
            lambda: ensemble.GradientBoostingRegressor(n_estimators=20), "reg"),
        "HistGradientBoostingRegressor": (
            lambda: ensemble.HistGradientBoostingRegressor(max_iter=20), "reg"),
        "Huber": (linear_model.HuberRegressor, "reg"),
        "Lasso": (linear_model.Lasso, "reg"),
        "ARD": (linear_model.ARDRegression, "reg"),
        "PLS": (cross_decomposition.PLSRegression, "reg"),
        "KMeans": (lambda: cluster.KMeans(4, n_init=2, random_state=0), "none"),
        "GMM diag": (lambda: mixture.GaussianMixture(
            3, covariance_type="diag", random_state=0), "none"),
        "BayesianGMM": (lambda: mixture.BayesianGaussianMixture(
            n_components=3, random_state=0), "none"),
        "PCA whiten": (lambda: decomposition.PCA(5, whiten=True), "none"),
        "IncrementalPCA": (lambda: decomposition.IncrementalPCA(5), "none"),
        "KernelPCA rbf": (lambda: decomposition.KernelPCA(4, kernel="rbf"), "none"),
        "GaussianRandomProjection": (
            lambda: random_projection.GaussianRandomProjection(4, random_state=0), "none"),
        "Polynomial+LogReg": (lambda: pipeline.make_pipeline(
            pp.PolynomialFeatures(2), pp.StandardScaler(), lr(max_iter=500)), "clf"),
        "KBins+LogReg": (lambda: pipeline.make_pipeline(
            pp.KBinsDiscretizer(5, encode="onehot-dense"), lr(max_iter=500)), "clf"),
        "Robust+MaxAbs+Ridge": (lambda: pipeline.make_pipeline(
            pp.RobustScaler(), pp.MaxAbsScaler(), linear_model.Ridge()), "reg"),
        "MinMax+SVC": (lambda: pipeline.make_pipeline(
            pp.MinMaxScaler(), svm.SVC(probability=True, random_state=0)), "clf"),
        "PowerTransformer": (pp.PowerTransformer, "pos"),
        "Normalizer+KNN": (lambda: pipeline.make_pipeline(
            pp.Normalizer(), neighbors.KNeighborsClassifier()), "clf"),
        "SelectKBest+LogReg": (lambda: pipeline.make_pipeline(
            feature_selection.SelectKBest(k=5), lr()), "clf"),
        "SVC poly": (lambda: svm.SVC(kernel="poly", probability=True, random_state=0), "clf"),
        "SVC sigmoid": (
            lambda: svm.SVC(kernel="sigmoid", probability=True, random_state=0), "clf"),
        "SVC linear": (lambda: svm.SVC(kernel="linear", probability=True, random_state=0), "clf"),
        "NuSVC": (lambda: svm.NuSVC(probability=True, random_state=0), "clf"),
        "NuSVR": (svm.NuSVR, "reg"),
        "LinearSVR": (svm.LinearSVR, "reg"),
    }  # fmt: skip


def _data() -> dict[str, tuple[np.ndarray, Any]]:
    from sklearn.datasets import make_classification, make_regression

    x, y = make_classification(n_samples=600, n_features=10, n_informative=7, n_classes=3,
                               random_state=0)  # fmt: skip
    xr, yr = make_regression(n_samples=400, n_features=10, random_state=0)
    x, xr = x.astype(np.float32), xr.astype(np.float32)
    return {"clf": (x, y), "bin": (x, y % 2), "pos": (np.abs(x) * 3 + 0.1, y),
            "reg": (xr, yr), "none": (x, None)}  # fmt: skip


def _agrees(got: list[Any], want: list[Any]) -> str:
    bad = []
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        if w.dtype.kind == "f":
            if not np.all(np.abs(g - w) <= 1e-6 + 1e-5 * np.abs(w)):
                rel = float((np.abs(g - w) / np.maximum(np.abs(w), 1e-6)).max())
                bad.append(f"{rel:.1e} rel")
        elif not np.array_equal(g, w):
            bad.append(f"{int((g != w).sum())} labels")
    return "ok" if not bad else ", ".join(bad)


def _timed(model: Any, sess: Any, feeds: dict[str, np.ndarray], calls: int) -> float:
    """tfrt_py's median over onnxruntime's, calls interleaved."""
    ours, theirs = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        model.run(feeds)
        t1 = time.perf_counter()
        sess.run(None, feeds)
        theirs.append(time.perf_counter() - t1)
        ours.append(t1 - t0)
    return float(np.median(ours) / np.median(theirs))


def sweep_one(make: Callable[[], Any], x: np.ndarray, y: Any, warm_s: float) -> str:
    """One table row's cells after the name."""
    import onnxruntime as ort
    from skl2onnx import to_onnx
    from sklearn.base import is_classifier

    import tfrt_py

    try:
        est = make().fit(x, y) if y is not None else make().fit(x)
        options = {id(est): {"zipmap": False}} if is_classifier(est) else None
        data = to_onnx(est, x[:1], options=options,
                       target_opset={"": 17, "ai.onnx.ml": 3}).SerializeToString()  # fmt: skip
    except Exception as e:  # noqa: BLE001 -- the converter's or the estimator's own refusal
        return f"not converted ({type(e).__name__}: {str(e)[:120]}) | | | |"
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    rows = x[:300] + np.random.default_rng(1).standard_normal((300, x.shape[1])).astype(
        np.float32) * 0.1  # fmt: skip
    feeds = {sess.get_inputs()[0].name: rows}
    want = sess.run(None, feeds)
    model = tfrt_py.load(data, native="eager")
    sync = tfrt_py.load(data, executor="sync")
    ratios = []
    for batch in (1, 1000):
        xb = {k: np.ascontiguousarray(np.resize(v, (batch, v.shape[1])))
              for k, v in feeds.items()}  # fmt: skip
        t_end = time.perf_counter() + warm_s  # auto compiles and tries its tiers first
        while time.perf_counter() < t_end:
            model.run(xb)
            sess.run(None, xb)
        ratios.append(_timed(model, sess, xb, 600 if batch == 1 else 300))
    auto = _agrees(list(model.run(feeds).values()), want)
    interp = _agrees(list(sync.run(feeds).values()), want)
    return f"{model.executor} | {auto} | {interp} | {ratios[0]:.2f}x | {ratios[1]:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated names (default: all)")
    ap.add_argument("--warm", type=float, default=4.0, help="seconds of warm-up per batch")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    data = _data()
    wanted = [n for n in args.only.split(",") if n]
    print("| estimator | auto serves | auto's outputs | interpreter's | b1 ratio | b1000 ratio |")
    print("|---|---|---|---|---:|---:|")
    for name, (make, kind) in estimators().items():
        if wanted and name not in wanted:
            continue
        x, y = data[kind]
        print(f"| {name} | {sweep_one(make, x, y, args.warm)} |", flush=True)


if __name__ == "__main__":
    main()
