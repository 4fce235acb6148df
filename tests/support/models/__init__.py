"""Real ONNX models built deterministically for the tests and benchmarks.

``MODELS`` maps a case name to a builder returning a ``ModelCase`` (an ``onnx.ModelProto``
plus sample feeds); ``build(name)`` builds once and caches. Nothing is downloaded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from . import anchors, control_flow, nn, sklearn_models
from .builders import ModelCase

__all__ = ["MODELS", "ModelCase", "build"]

MODELS: dict[str, Callable[[], ModelCase]] = {
    "mlp": nn.mlp,
    "cnn": nn.cnn,
    "gru": nn.gru,
    "lstm_bidirectional": nn.lstm,
    "transformer_erf": nn.transformer_erf,
    "transformer_gelu20": nn.transformer_gelu20,
    "recommender": nn.recommender,
    "dynamic_batch": nn.dynamic_batch,
    "if_loop": control_flow.if_loop,
    "sklearn_scaler_mlp": sklearn_models.scaler_mlp_classifier,
    "sklearn_logreg_zipmap": sklearn_models.logistic_regression,
    "sklearn_gb_classifier": sklearn_models.gradient_boosting_classifier,
    "sklearn_gb_regressor": sklearn_models.gradient_boosting_regressor,
    "sklearn_rf_regressor": sklearn_models.random_forest_regressor,
    "anchor_m1": anchors.m1,
    "anchor_m2": anchors.m2,
    "anchor_m2b": anchors.m2b,
    "anchor_m3": anchors.m3,
    "anchor_m4": anchors.m4,
}


@functools.cache
def build(name: str) -> ModelCase:
    """The named case, built on first use and cached for the session."""
    case = MODELS[name]()
    assert case.name == name, f"builder for {name!r} returned case {case.name!r}"
    return case
