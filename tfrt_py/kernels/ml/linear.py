"""Kernels (ml): scalers, linear models and feature plumbing.

Scaler, Normalizer, Binarizer, Imputer, LinearClassifier, LinearRegressor,
ArrayFeatureExtractor, FeatureVectorizer. Outputs keep the ONNX-ML types: Scaler,
Normalizer, Linear* scores and FeatureVectorizer give float32; Binarizer and Imputer keep
X's dtype; ArrayFeatureExtractor keeps X's dtype (strings too). Numeric details follow
onnxruntime (Normalizer leaves an all-zero row unchanged; a binary LinearClassifier with
one coefficient row scores ``[1 - s, s]``, or ``[sigmoid(-s), sigmoid(s)]``, and labels
by ``s > 0``).
"""

from __future__ import annotations

import numpy as np

from ..base import OUT, OUT_INPLACE, ComputeFn, KernelContext
from ..registry import KernelRegistry
from . import linear_jit as jit
from .common import ML_DOMAIN, as_2d, attr_floats, attr_ints, attr_strings, post_transform

__all__ = ["class_labels", "register_kernels"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _float(x: np.ndarray) -> np.ndarray:
    """X as float32 (ONNX-ML float outputs), keeping float32 input as is."""
    return x if x.dtype == _F32 else x.astype(_F32)


def _scaler(ctx: KernelContext) -> ComputeFn:
    """Scaler: Y = (X - offset) * scale, float32, offset/scale broadcast on the last axis
    (one value or one per feature); float64 input is computed in float64, then cast."""
    offset = attr_floats(ctx, "offset", np.float64)
    scale = attr_floats(ctx, "scale", np.float64)
    off32 = (offset if offset is not None else np.zeros(1)).astype(_F32)
    sc32 = (scale if scale is not None else np.ones(1)).astype(_F32)
    off64, sc64 = off32.astype(_F64), sc32.astype(_F64)

    def scaler(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.dtype == _F64:
            y = (x - off64) * sc64
            if out is None:
                return y.astype(_F32)
            out[...] = y
            return out
        if x.dtype != _F32:
            x = x.astype(_F32)
        y = np.subtract(x, off32, out=out)
        return np.multiply(y, sc32, out=y)

    return scaler


def _normalizer(ctx: KernelContext) -> ComputeFn:
    """Normalizer: each row divided by its MAX (of its non-NaN values, as onnxruntime),
    L1 or L2 norm (float32); a row whose norm is 0 is copied unchanged. 1-D X is one row."""
    norm = ctx.attr("norm", "MAX")
    if norm not in ("MAX", "L1", "L2"):
        raise ctx.unsupported(f"norm {norm!r} is not MAX, L1 or L2")

    fast = jit.normalizer()
    code = jit.NORMS[norm]

    def normalizer(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        x2 = as_2d(_float(x))
        if fast is not None and x2.flags.c_contiguous and (out is None or out.flags.c_contiguous):
            y = np.empty(x2.shape, _F32) if out is None else out.reshape(x2.shape)
            fast(x2, code, y)
            return y.reshape(x.shape) if out is None else out
        if norm == "MAX":
            # onnxruntime's running std::max skips NaN (fmax); an all-NaN row stays NaN
            d = (
                np.fmax.reduce(x2, axis=1, keepdims=True)
                if x2.shape[1]
                else np.ones((len(x2), 1), _F32)
            )
        elif norm == "L1":
            d = np.abs(x2).sum(axis=1, keepdims=True)
        else:
            d = np.sqrt(np.square(x2).sum(axis=1, keepdims=True))
        d[d == 0] = 1
        if out is None:
            return np.divide(x2, d).reshape(x.shape)
        np.divide(x2, d, out=out.reshape(x2.shape))
        return out

    return normalizer


def _binarizer(ctx: KernelContext) -> ComputeFn:
    """Binarizer: Y = 1 where X > threshold else 0, in X's dtype."""
    threshold = float(ctx.attr("threshold", 0.0))

    def binarizer(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        m = x > threshold
        if out is None:
            return m.astype(x.dtype)
        np.copyto(out, m)
        return out

    return binarizer


def _imputer(ctx: KernelContext) -> ComputeFn:
    """Imputer: replace ``replaced_value_*`` (NaN too when it is NaN) by the imputed value
    (one, or one per feature on the last axis); same dtype as X."""
    fvals = attr_floats(ctx, "imputed_value_floats", np.float64)
    ivals = attr_ints(ctx, "imputed_value_int64s")
    if fvals is not None and len(fvals):
        values: np.ndarray = fvals
        replaced: float = float(ctx.attr("replaced_value_float", 0.0))
    elif ivals is not None and len(ivals):
        values = ivals
        replaced = int(ctx.attr("replaced_value_int64", 0))
    else:
        raise ctx.unsupported("imputed_value_floats or imputed_value_int64s is required")
    by_nan = isinstance(replaced, float) and np.isnan(replaced)
    per_dtype: dict[np.dtype, np.ndarray] = {}

    def imputer(x: np.ndarray) -> np.ndarray:
        v = per_dtype.get(x.dtype)
        if v is None:
            v = per_dtype[x.dtype] = values.astype(x.dtype)
        mask = np.isnan(x) if by_nan else x == replaced
        if len(v) > 1 and x.ndim and x.shape[-1] != len(v):
            raise ValueError(f"Imputer has {len(v)} values for {x.shape[-1]} features")
        return np.where(mask, v if len(v) > 1 else v[0], x)

    return imputer


def _labels(ctx: KernelContext) -> tuple[np.ndarray | None, bool]:
    strs = attr_strings(ctx, "classlabels_strings")
    if strs:
        return np.array(strs, dtype=object), True
    ints = attr_ints(ctx, "classlabels_ints")
    return (ints if ints is not None and len(ints) else None), False


def _linear_classifier(ctx: KernelContext) -> ComputeFn:
    """LinearClassifier: scores = X @ W.T + b (float32), label = argmax (first max).

    One coefficient row with two labels is onnxruntime's binary form: label by
    ``s > 0`` and scores ``[1 - s, s]`` (``[sigmoid(-s), sigmoid(s)]`` for LOGISTIC)."""
    coef = attr_floats(ctx, "coefficients", np.float64)
    if coef is None:
        raise ctx.unsupported("coefficients are required")
    inter = attr_floats(ctx, "intercepts", np.float64)
    labels, is_str = _labels(ctx)
    if inter is not None and len(inter):
        n_cls = len(inter)
    elif labels is not None and len(labels) and len(coef) % len(labels) == 0:
        n_cls = len(labels)
    else:
        n_cls = 1
    if len(coef) % n_cls:
        raise ctx.unsupported(f"{len(coef)} coefficients do not split into {n_cls} classes")
    w_t = coef.reshape(n_cls, -1).T.astype(_F32).copy()
    b = (inter if inter is not None and len(inter) else np.zeros(n_cls)).astype(_F32)
    tname, transform = post_transform(ctx)
    if labels is None:
        labels = np.arange(max(n_cls, 2), dtype=np.int64)
    binary = n_cls == 1
    if binary:
        two = len(labels) == 2
        pos = labels[1] if two else ("1" if is_str else np.int64(1))
        neg = labels[0] if two else ("0" if is_str else np.int64(0))
    elif len(labels) < n_cls:
        raise ctx.unsupported(f"{len(labels)} class labels for {n_cls} classes")
    ldtype = labels.dtype
    if binary:  # label = pair[s > 0]: one take instead of a where and a cast
        pair = np.array([neg, pos], dtype=ldtype)
    how = {"NONE": jit.NONE, "LOGISTIC": jit.LOGISTIC, "SOFTMAX": jit.SOFTMAX}.get(tname)
    if binary and (not two or how == jit.SOFTMAX):
        how = None
    fast = None if how is None else jit.linear_classifier()
    mode = (jit.BINARY if binary else jit.MULTI) | (how or 0)
    w_rows = np.ascontiguousarray(w_t.T)  # (C, K)
    width = 2 if binary else n_cls
    picks = pair if binary else labels

    def linear_classifier(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x2 = as_2d(_float(x))
        if (
            fast is not None and x2.flags.c_contiguous and x2.shape[1] == w_rows.shape[1]
            and x2.size * n_cls <= jit.MAX_MACS
        ):  # fmt: skip
            idx = np.empty(x2.shape[0], np.int64)
            scores = np.empty((x2.shape[0], width), _F32)
            fast(x2, w_rows, b, mode, idx, scores)
            return picks.take(idx), scores
        s = x2 @ w_t
        s += b
        if binary:
            label = pair.take((s[:, 0] > 0).view(np.int8))
            if tname == "PROBIT":
                s = transform(s)
            if two:
                if tname == "LOGISTIC":
                    s = np.concatenate([transform(-s), transform(s)], axis=1)
                else:
                    s = np.stack([1 - s[:, 0], s[:, 0]], axis=1)
            return label, s
        label = labels.take(s.argmax(axis=1))
        return label, transform(s)

    return linear_classifier


def _linear_regressor(ctx: KernelContext) -> ComputeFn:
    """LinearRegressor: Y = X @ W.T + intercepts, float32 (N, targets), then
    post_transform."""
    coef = attr_floats(ctx, "coefficients", np.float64)
    if coef is None:
        raise ctx.unsupported("coefficients are required")
    targets = int(ctx.attr("targets", 1))
    if targets < 1 or len(coef) % targets:
        raise ctx.unsupported(f"{len(coef)} coefficients do not split into {targets} targets")
    w_t = coef.reshape(targets, -1).T.astype(_F32).copy()
    inter = attr_floats(ctx, "intercepts", np.float64)
    b = (inter if inter is not None and len(inter) else np.zeros(targets)).astype(_F32)
    tname, transform = post_transform(ctx)

    def linear_regressor(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        x2 = as_2d(_float(x))
        y = np.matmul(x2, w_t, out=out)
        y += b
        if tname != "NONE":
            if out is None:
                return transform(y)
            out[...] = transform(y)
        return y

    return linear_regressor


def _array_feature_extractor(ctx: KernelContext) -> ComputeFn:
    """ArrayFeatureExtractor: X[..., indices] (indices flattened); 1-D X gives (1, k)."""
    const = ctx.const_input(1)
    const_idx = None if const is None else np.asarray(const, dtype=np.intp).reshape(-1)

    def array_feature_extractor(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        idx = const_idx if const_idx is not None else np.asarray(indices, np.intp).reshape(-1)
        if len(idx) and (idx.max() >= x.shape[-1] or idx.min() < -x.shape[-1]):
            raise IndexError(f"ArrayFeatureExtractor index out of range for {x.shape[-1]}")
        y = np.take(x, idx, axis=-1)
        return y.reshape(1, -1) if x.ndim == 1 else y

    return array_feature_extractor


def _feature_vectorizer(ctx: KernelContext) -> ComputeFn:
    """FeatureVectorizer: concatenate the inputs' features into float32 (N, sum(dims)),
    each input truncated or zero-padded to its ``inputdimensions`` entry."""
    dims = attr_ints(ctx, "inputdimensions")
    if dims is None or len(dims) != ctx.n_inputs:
        raise ctx.unsupported("inputdimensions must give one size per input")
    sizes = [int(d) for d in dims]
    starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    total = int(sum(sizes))

    def feature_vectorizer(*xs: np.ndarray) -> np.ndarray:
        parts = [as_2d(np.asarray(x)) for x in xs]
        n = parts[0].shape[0]
        if all(p.shape == (n, d) for p, d in zip(parts, sizes)):
            return np.concatenate(parts, axis=1, dtype=_F32)
        out = np.zeros((n, total), dtype=_F32)
        for p, d, s in zip(parts, sizes, starts):
            if p.shape[0] != n:
                raise ValueError("FeatureVectorizer inputs differ in their number of rows")
            k = min(d, p.shape[1])
            out[:, s : s + k] = p[:, :k]
        return out

    return feature_vectorizer


def register_kernels(registry: KernelRegistry) -> None:
    """Register Scaler, Normalizer, Binarizer, Imputer, the linear models and the feature
    plumbing (ArrayFeatureExtractor, FeatureVectorizer)."""
    registry.add("Scaler", _scaler, domain=ML_DOMAIN, since=1, flags=OUT)
    registry.add("Normalizer", _normalizer, domain=ML_DOMAIN, since=1, flags=OUT)
    registry.add("Binarizer", _binarizer, domain=ML_DOMAIN, since=1, flags=OUT_INPLACE)
    registry.add("Imputer", _imputer, domain=ML_DOMAIN, since=1)
    registry.add("LinearClassifier", _linear_classifier, domain=ML_DOMAIN, since=1)
    registry.add("LinearRegressor", _linear_regressor, domain=ML_DOMAIN, since=1, flags=OUT)
    registry.add("ArrayFeatureExtractor", _array_feature_extractor, domain=ML_DOMAIN, since=1)
    registry.add("FeatureVectorizer", _feature_vectorizer, domain=ML_DOMAIN, since=1)


#: The class labels of a linear model (shared with the native lowering).
class_labels = _labels
