"""Kernels: the ai.onnx.ml family (classical ML operators).

Registered in domain ``ai.onnx.ml``. The kernels live in ``ml_*.py`` modules:
``ml_tree_ops`` (tree ensembles, on the vectorized evaluator of ``ml_tree``),
``ml_linear`` (scalers, linear models, feature plumbing), ``ml_encode`` (label and
category encoders, ZipMap, DictVectorizer) and ``ml_svm`` (support vector machines).
Scores and labels follow onnxruntime where the ONNX-ML spec leaves details open.
"""

from __future__ import annotations

from ..base import KernelBuilder, KernelFlags
from ..registry import KernelRegistry
from .common import ML_DOMAIN
from .encode import (
    build_cast_map,
    build_category_mapper,
    build_dict_vectorizer,
    build_label_encoder,
    build_one_hot_encoder,
    build_zipmap,
)
from .linear import (
    build_array_feature_extractor,
    build_binarizer,
    build_feature_vectorizer,
    build_imputer,
    build_linear_classifier,
    build_linear_regressor,
    build_normalizer,
    build_scaler,
)
from .svm import build_svm_classifier, build_svm_regressor
from .tree_ops import build_tree_classifier, build_tree_ensemble, build_tree_regressor

_PLAIN = KernelFlags()
_OUT = KernelFlags(supports_out=True)
_OUT_INPLACE = KernelFlags(supports_out=True, inplace=True)


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels."""

    def add(op: str, build: KernelBuilder, since: int = 1, flags: KernelFlags = _PLAIN) -> None:
        registry.add(op, build, domain=ML_DOMAIN, since=since, flags=flags)

    add("ArrayFeatureExtractor", build_array_feature_extractor)
    add("Binarizer", build_binarizer, flags=_OUT_INPLACE)
    add("CastMap", build_cast_map)
    add("CategoryMapper", build_category_mapper)
    add("DictVectorizer", build_dict_vectorizer)
    add("FeatureVectorizer", build_feature_vectorizer)
    add("Imputer", build_imputer)
    add("LabelEncoder", build_label_encoder)
    add("LinearClassifier", build_linear_classifier)
    add("LinearRegressor", build_linear_regressor, flags=_OUT)
    add("Normalizer", build_normalizer, flags=_OUT)
    add("OneHotEncoder", build_one_hot_encoder)
    add("Scaler", build_scaler, flags=_OUT)
    add("SVMClassifier", build_svm_classifier)
    add("SVMRegressor", build_svm_regressor)
    add("TreeEnsembleClassifier", build_tree_classifier)
    add("TreeEnsembleRegressor", build_tree_regressor)
    add("TreeEnsemble", build_tree_ensemble, since=5)
    add("ZipMap", build_zipmap)
