"""scikit-learn models converted with skl2onnx (default domain opset 17, ai.onnx.ml 3).

Trained on small synthetic data sets with fixed seeds, so each builder returns the same
model every time. ZipMap is enabled for the logistic regression (its probabilities come
back as a list of {class: probability} dicts) and disabled for the others.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx

from .builders import ModelCase

TARGET_OPSET = {"": 17, "ai.onnx.ml": 3}
N_FEATURES = 8


def _classification_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=240,
        n_features=N_FEATURES,
        n_informative=5,
        n_redundant=1,
        n_classes=3,
        random_state=0,
    )
    x = x.astype(np.float32)
    return x[:200], y[:200], x[200:216]


def _regression_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import make_regression

    x, y = make_regression(
        n_samples=240, n_features=N_FEATURES, n_informative=5, noise=0.5, random_state=1
    )
    x = x.astype(np.float32)
    return x[:200], y[:200], x[200:216]


def _convert(estimator: Any, n_features: int, options: dict[Any, Any] | None) -> onnx.ModelProto:
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    model = to_onnx(
        estimator,
        initial_types=[("X", FloatTensorType([None, n_features]))],
        target_opset=TARGET_OPSET,
        options=options,
    )
    assert isinstance(model, onnx.ModelProto)
    onnx.checker.check_model(model)
    return model


def scaler_mlp_classifier() -> ModelCase:
    """StandardScaler + MLPClassifier pipeline, ZipMap disabled: label int64[N] and
    probabilities float[N,3]."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y, x_test = _classification_data()
    mlp = MLPClassifier(hidden_layer_sizes=(16,), max_iter=200, random_state=0)
    pipe = make_pipeline(StandardScaler(), mlp)
    with warnings.catch_warnings():
        # A short training run on purpose (fast tests); the fit need not converge.
        warnings.simplefilter("ignore", ConvergenceWarning)
        pipe.fit(x, y)
    model = _convert(pipe, N_FEATURES, {id(mlp): {"zipmap": False}})
    return ModelCase("sklearn_scaler_mlp", model, ({"X": x_test}, {"X": x_test[:1]}))


def logistic_regression() -> ModelCase:
    """Multinomial LogisticRegression with ZipMap enabled (skl2onnx's default)."""
    from sklearn.linear_model import LogisticRegression

    x, y, x_test = _classification_data()
    clf = LogisticRegression(max_iter=500).fit(x, y)
    model = _convert(clf, N_FEATURES, None)
    return ModelCase("sklearn_logreg_zipmap", model, ({"X": x_test}, {"X": x_test[:3]}))


def gradient_boosting_classifier() -> ModelCase:
    """3-class GradientBoostingClassifier (TreeEnsembleClassifier), ZipMap disabled."""
    from sklearn.ensemble import GradientBoostingClassifier

    x, y, x_test = _classification_data()
    clf = GradientBoostingClassifier(n_estimators=15, max_depth=3, random_state=0).fit(x, y)
    model = _convert(clf, N_FEATURES, {id(clf): {"zipmap": False}})
    return ModelCase("sklearn_gb_classifier", model, ({"X": x_test},))


def gradient_boosting_regressor() -> ModelCase:
    """GradientBoostingRegressor (TreeEnsembleRegressor, aggregate SUM + base value)."""
    from sklearn.ensemble import GradientBoostingRegressor

    x, y, x_test = _regression_data()
    reg = GradientBoostingRegressor(n_estimators=20, max_depth=3, random_state=0).fit(x, y)
    model = _convert(reg, N_FEATURES, None)
    return ModelCase("sklearn_gb_regressor", model, ({"X": x_test},))


def random_forest_regressor() -> ModelCase:
    """RandomForestRegressor (TreeEnsembleRegressor, aggregate AVERAGE)."""
    from sklearn.ensemble import RandomForestRegressor

    x, y, x_test = _regression_data()
    reg = RandomForestRegressor(n_estimators=8, max_depth=5, random_state=0).fit(x, y)
    model = _convert(reg, N_FEATURES, None)
    return ModelCase("sklearn_rf_regressor", model, ({"X": x_test},))
