"""Build the classic-ML model zoo: real exporters' models from fixed seeds, nothing
downloaded.

    python benchmarks/zoo_build.py [--out benchmarks/zoo]      # the benchmark zoo
    python benchmarks/zoo_build.py --small --out tests/data/ml_zoo   # the test files

Each model is trained on random data (``make_classification`` / ``make_regression``,
fixed seeds) and exported as its exporter does by default: scikit-learn via skl2onnx
(RandomForest, HistGradientBoosting, SVC(probability=True), StandardScaler +
LogisticRegression, KNeighbors, the wider list of issue 39, and ``zoo_text``'s pipelines
over string inputs), LightGBM and XGBoost via onnxmltools. Every input has a
dynamic batch dim. For each model the script writes ``NAME.onnx`` and ``NAME.npz``: the
feeds at batch 1 and 1000 (``X_<batch>``, or ``in:<input>_<batch>`` for models with named
inputs) and onnxruntime's outputs for them (``benchmarks/zoo.py`` checks
tfrt_py against them). ``--small`` makes tiny versions (a few trees, a few support
vectors) and a few variants (string labels, binary, regressors) for the tests, a few
hundred KB in all, so ``make test`` needs none of the exporters.

Needs scikit-learn, skl2onnx, lightgbm, xgboost, onnxmltools (``make bench-zoo`` installs
them); a model whose exporter is missing is skipped with a message.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
F = 20  # features of the benchmark zoo
F_SMALL = 8


@contextlib.contextmanager
def _int_attrs() -> Iterator[None]:
    """skl2onnx 1.20 passes Python bools among ints in ``nodes_missing_value_tracks_true``
    for scikit-learn >= 1.8 HistGradientBoosting, which onnx refuses; ints they are."""
    import onnx.helper as h

    orig = h.make_attribute

    def make_attribute(key: str, value: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(value, list) and any(isinstance(v, bool) for v in value):
            value = [int(v) for v in value]
        return orig(key, value, *args, **kw)

    h.make_attribute = make_attribute
    try:
        yield
    finally:
        h.make_attribute = orig


def _data(n_features: int, n_classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification

    x, y = make_classification(2000, n_features, n_informative=min(10, n_features - 2),
                               n_classes=n_classes, random_state=seed)  # fmt: skip
    return x.astype(np.float32), y


def _skl(est: Any, f: int, zipmap: bool = True) -> Any:
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    final = est.steps[-1][1] if hasattr(est, "steps") else est
    options = None if zipmap else {id(final): {"zipmap": False}}
    with _int_attrs(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(est, initial_types=[("X", FloatTensorType([None, f]))],
                       target_opset={"": 17, "ai.onnx.ml": 3}, options=options)  # fmt: skip


def _mltools(kind: str, est: Any, f: int) -> Any:
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    convert = onnxmltools.convert_lightgbm if kind == "lightgbm" else onnxmltools.convert_xgboost
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert(est, initial_types=[("X", FloatTensorType([None, f]))], target_opset=15)


def zoo(small: bool) -> dict[str, Callable[[], Any]]:
    """Model name -> builder (the exporters are imported inside)."""
    f = F_SMALL if small else F
    trees = 5 if small else 100
    x, y = _data(f)

    def rf() -> Any:
        from sklearn.ensemble import RandomForestClassifier

        est = RandomForestClassifier(trees, max_depth=4 if small else 8, random_state=0)
        return _skl(est.fit(x, y), f)

    def hgb() -> Any:
        from sklearn.ensemble import HistGradientBoostingClassifier

        est = HistGradientBoostingClassifier(max_iter=trees, max_depth=4 if small else None,
                                             random_state=0)  # fmt: skip
        return _skl(est.fit(x, y), f)

    def svc() -> Any:
        from sklearn.svm import SVC

        n = 60 if small else 500
        return _skl(SVC(probability=True, random_state=0).fit(x[:n], y[:n]), f)

    def logreg() -> Any:
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return _skl(make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y), f)

    def knn() -> Any:
        from sklearn.neighbors import KNeighborsClassifier

        n = 60 if small else 500
        return _skl(KNeighborsClassifier(5).fit(x[:n], y[:n]), f)

    def lgbm() -> Any:
        import lightgbm

        est = lightgbm.LGBMClassifier(n_estimators=trees, num_leaves=8 if small else 31,
                                      verbose=-1, random_state=0)  # fmt: skip
        return _mltools("lightgbm", est.fit(x, y), f)

    def xgb() -> Any:
        import xgboost

        est = xgboost.XGBClassifier(n_estimators=trees, max_depth=3 if small else 6,
                                    random_state=0)  # fmt: skip
        return _mltools("xgboost", est.fit(x, y), f)

    def catboost() -> Any:
        """CatBoost's own ONNX export (a TreeEnsembleClassifier and a ZipMap), its input
        named ``X`` as the zoo's feeds are."""
        import tempfile

        import catboost
        import onnx

        est = catboost.CatBoostClassifier(iterations=trees, depth=6, random_seed=0,
                                          verbose=False, thread_count=1,
                                          allow_writing_files=False).fit(x, y)  # fmt: skip
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "catboost.onnx")
            est.save_model(path, format="onnx", export_parameters={
                "onnx_domain": "ai.catboost", "onnx_model_version": 1})  # fmt: skip
            model = onnx.load(path)
        for v in model.graph.input:
            v.name = "X" if v.name == "features" else v.name
        for node in model.graph.node:
            node.input[:] = ["X" if i == "features" else i for i in node.input]
        return model

    def iforest() -> Any:
        from sklearn.ensemble import IsolationForest

        est = IsolationForest(n_estimators=5 if small else 50, random_state=0)
        return _skl(est.fit(x), f)

    def kmeans() -> Any:
        from sklearn.cluster import KMeans

        return _skl(KMeans(8, n_init=1, random_state=0).fit(x), f)

    def wider() -> dict[str, Callable[[], Any]]:
        """The rest of what a user is likely to export with skl2onnx (issue 39's list)."""
        from sklearn import (
            calibration,
            decomposition,
            ensemble,
            linear_model,
            naive_bayes,
            neighbors,
            svm,
        )
        from sklearn.cluster import MiniBatchKMeans
        from sklearn.impute import SimpleImputer
        from sklearn.mixture import GaussianMixture
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import MinMaxScaler, Normalizer, StandardScaler

        xn = MinMaxScaler().fit_transform(x).astype(np.float32)  # non-negative: MultinomialNB
        xm = x.copy()
        xm[::7, 3] = np.nan  # missing values for the imputer
        ests: dict[str, Any] = {
            "sklearn_pca": lambda: decomposition.PCA(5).fit(x),
            "sklearn_truncated_svd": lambda: decomposition.TruncatedSVD(5).fit(x),
            "sklearn_gaussian_nb": lambda: naive_bayes.GaussianNB().fit(x, y),
            "sklearn_multinomial_nb": lambda: naive_bayes.MultinomialNB().fit(xn, y),
            "sklearn_mlp": lambda: MLPClassifier((32,), max_iter=50, random_state=0).fit(x, y),
            "sklearn_ridge": lambda: linear_model.Ridge().fit(x, y.astype(np.float32)),
            "sklearn_sgd": lambda: linear_model.SGDClassifier(random_state=0).fit(x, y),
            "sklearn_linear_svc": lambda: svm.LinearSVC(random_state=0).fit(x, y),
            "sklearn_knn_regressor": lambda: neighbors.KNeighborsRegressor(5).fit(x[:300], y[:300]),
            "sklearn_minibatch_kmeans": lambda: MiniBatchKMeans(
                8, n_init=1, batch_size=256, random_state=0
            ).fit(x),
            "sklearn_gaussian_mixture": lambda: GaussianMixture(
                4, reg_covar=1e-3, random_state=0
            ).fit(x),
            "sklearn_imputer_scaler_logreg": lambda: make_pipeline(
                SimpleImputer(), StandardScaler(), linear_model.LogisticRegression()
            ).fit(xm, y),
            # 2026-12-06: estimators a sweep of 54 found off the native tier or inexact
            "sklearn_adaboost": lambda: ensemble.AdaBoostClassifier(
                n_estimators=20, random_state=0).fit(x, y),
            "sklearn_calibrated_isotonic": lambda: calibration.CalibratedClassifierCV(
                linear_model.LogisticRegression(), method="isotonic", cv=3).fit(x, y),
            "sklearn_normalizer_knn": lambda: make_pipeline(
                Normalizer(), neighbors.KNeighborsClassifier()).fit(x[:300], y[:300]),
            "sklearn_gradient_boosting_regressor": lambda: ensemble.GradientBoostingRegressor(
                n_estimators=50, random_state=0).fit(x, y.astype(np.float32)),
            "sklearn_svr": lambda: svm.SVR().fit(x[:400], y[:400].astype(np.float32)),
            "sklearn_one_class_svm": lambda: svm.OneClassSVM(gamma="scale").fit(x[:400]),
        }  # fmt: skip

        def export(make: Callable[[], Any]) -> Callable[[], Any]:
            return lambda: _skl(make(), f)

        return {name: export(make) for name, make in ests.items()}

    models: dict[str, Callable[[], Any]] = {
        "sklearn_isolation_forest": iforest, "sklearn_kmeans": kmeans,
        "sklearn_random_forest": rf, "sklearn_hist_gradient_boosting": hgb,
        "sklearn_svc_proba": svc, "sklearn_scaler_logreg": logreg, "sklearn_knn": knn,
        "lightgbm_classifier": lgbm, "xgboost_classifier": xgb,
    }  # fmt: skip
    models.update(wider())
    if small:
        models.update(_variants(x, y, f))
    else:
        from zoo_text import models as text_models

        models["catboost_classifier"] = catboost  # skipped where catboost is not installed
        models.update(text_models())
    return models


def _variants(x: np.ndarray, y: np.ndarray, f: int) -> dict[str, Callable[[], Any]]:
    """Test-only variants: string labels, a binary classifier, regressors, no ZipMap."""
    from sklearn.datasets import make_regression

    xr, yr = make_regression(400, f, n_informative=5, random_state=1)
    xr = xr.astype(np.float32)
    names = np.array(["cat", "dog", "emu"])

    def rf_strings() -> Any:
        from sklearn.ensemble import RandomForestClassifier

        return _skl(RandomForestClassifier(4, max_depth=3, random_state=0).fit(x, names[y]), f)

    def gb_binary() -> Any:
        from sklearn.ensemble import GradientBoostingClassifier

        est = GradientBoostingClassifier(n_estimators=5, max_depth=3, random_state=0)
        return _skl(est.fit(x, y % 2), f, zipmap=False)

    def svc_linear_binary() -> Any:
        from sklearn.svm import SVC

        return _skl(SVC(kernel="linear").fit(x[:80], y[:80] % 2), f, zipmap=False)

    def svr_poly() -> Any:
        from sklearn.svm import SVR

        return _skl(SVR(kernel="poly", degree=3).fit(xr[:80], yr[:80]), f)

    def rf_regressor() -> Any:
        from sklearn.ensemble import RandomForestRegressor

        return _skl(RandomForestRegressor(4, max_depth=4, random_state=0).fit(xr, yr), f)

    def normalizer_binarizer_logreg() -> Any:
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import Binarizer, Normalizer

        est = make_pipeline(Normalizer("l2"), Binarizer(threshold=0.1), LogisticRegression())
        return _skl(est.fit(x, y % 2), f, zipmap=False)

    def linear_regression() -> Any:
        from sklearn.linear_model import LinearRegression

        return _skl(LinearRegression().fit(xr, yr), f)

    return {
        "rf_string_labels": rf_strings, "gb_binary": gb_binary,
        "svc_linear_binary": svc_linear_binary, "svr_poly": svr_poly,
        "rf_regressor": rf_regressor, "normalizer_binarizer_logreg": normalizer_binarizer_logreg,
        "linear_regression": linear_regression,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "zoo"))
    ap.add_argument("--small", action="store_true", help="tiny models for the tests")
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    args = ap.parse_args()
    import onnxruntime as ort

    os.makedirs(args.out, exist_ok=True)
    models = zoo(args.small)
    wanted = [m for m in args.models.split(",") if m] or list(models)
    rng = np.random.default_rng(1234)
    for name in wanted:
        try:
            model = models[name]()
        except ImportError as e:
            print(f"{name}: skipped ({e})", file=sys.stderr)
            continue
        data = model.SerializeToString()
        with open(os.path.join(args.out, name + ".onnx"), "wb") as f:
            f.write(data)
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        n_in = sess.get_inputs()[0].shape[1]
        saved: dict[str, np.ndarray] = {}
        feeds_of = getattr(models[name], "feeds", None)  # named inputs (zoo_text)
        for batch in (1, 1000) if not args.small else (1, 37):
            if feeds_of is None:
                feeds = {"X": rng.standard_normal((batch, n_in)).astype(np.float32)}
                saved[f"X_{batch}"] = feeds["X"]
            else:
                feeds = feeds_of(rng, batch)
                saved.update({f"in:{k}_{batch}": v for k, v in feeds.items()})
                feeds = {k: v.astype(object) if v.dtype.kind == "U" else v
                         for k, v in feeds.items()}  # fmt: skip
            for out, val in zip(sess.get_outputs(), sess.run(None, feeds)):
                if isinstance(val, list):  # ZipMap: rows of {label: probability}
                    keys = list(val[0])
                    saved[f"{out.name}_{batch}"] = np.array([[r[k] for k in keys] for r in val])
                else:
                    saved[f"{out.name}_{batch}"] = np.asarray(val)
        if not args.small:
            np.savez_compressed(os.path.join(args.out, name + ".npz"), **saved)
        print(f"{name}: {len(data) / 1024:.0f} KB")


if __name__ == "__main__":
    main()
