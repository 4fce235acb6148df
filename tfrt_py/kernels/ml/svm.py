"""Kernels (ml): support vector machines -- SVMClassifier and SVMRegressor.

Kernels (``kernel_params`` = gamma, coef0, degree): LINEAR ``x.s``, POLY
``(gamma x.s + coef0) ** degree``, RBF ``exp(-gamma |x - s|^2)``, SIGMOID
``tanh(gamma x.s + coef0)``. Without support vectors the model is linear
(``X @ coefficients.T + rho[0]``). Computation is float32, as onnxruntime's.

SVMClassifier (one-vs-one, libsvm layout): scores are the pairwise decision values
(``2`` columns for two classes), or with ``prob_a``/``prob_b`` the class probabilities by
libsvm's pairwise coupling; the label is the class with most pairwise votes. Outputs
(label int64 or string (N,), scores float32). SVMRegressor gives float32 (N, 1).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry
from .common import ML_DOMAIN, as_2d, attr_floats, attr_ints, attr_strings, logistic, post_transform

__all__ = ["register_kernels"]

_F32 = np.dtype(np.float32)


def _kernel(
    ctx: KernelContext, s_t64: np.ndarray, linear: bool = False
) -> Callable[[np.ndarray], np.ndarray]:
    """kernel(X (N, F) float32) -> (N, V) float32 against the support vectors S_T (F, V)
    for the node's kernel_type (or LINEAR when ``linear``)."""
    kind = "LINEAR" if linear else ctx.attr("kernel_type", "LINEAR")
    params = attr_floats(ctx, "kernel_params", np.float64)
    gamma, coef0, degree = ((params.tolist() if params is not None else []) + [0.0] * 3)[:3]
    g, c, d = np.float32(gamma), np.float32(coef0), float(degree)
    s_t = s_t64.astype(_F32)
    if kind == "LINEAR":
        return lambda x: x @ s_t

    if kind == "POLY":

        def poly(x: np.ndarray) -> np.ndarray:
            k = x @ s_t
            k *= g
            k += c
            return k * k if d == 2.0 else (k * k * k if d == 3.0 else k**d)

        return poly
    if kind == "SIGMOID":

        def sigmoid(x: np.ndarray) -> np.ndarray:
            k = x @ s_t
            k *= g
            k += c
            return np.tanh(k, out=k)

        return sigmoid
    if kind == "RBF":
        # |x - s|^2 = |x|^2 - 2 x.s + |s|^2 in float64 so that the cancellation stays
        # harmless; exp in float32 like onnxruntime.
        s_sq = (s_t64 * s_t64).sum(axis=0)

        def rbf(x: np.ndarray) -> np.ndarray:
            x64 = x.astype(np.float64)
            dist = (x64 * x64).sum(axis=1, keepdims=True) - 2 * (x64 @ s_t64) + s_sq
            np.maximum(dist, 0, out=dist)
            dist *= -float(gamma)
            return np.exp(dist.astype(_F32))

        return rbf
    raise ctx.unsupported(f"kernel_type {kind!r} is not supported")


def _x32(x: np.ndarray) -> np.ndarray:
    x2 = as_2d(x)
    return x2 if x2.dtype == _F32 else x2.astype(_F32)


def _svm_regressor(ctx: KernelContext) -> ComputeFn:
    """SVMRegressor: Y = K(X, S) @ coefficients + rho[0] (float32 (N, 1)); one_class maps
    Y to +1 / -1; post_transform PROBIT (the only one with a meaning for 1 output)."""
    coef = attr_floats(ctx, "coefficients", np.float64)
    sv = attr_floats(ctx, "support_vectors", np.float64)
    rho = attr_floats(ctx, "rho", np.float64)
    if coef is None:
        raise ctx.unsupported("coefficients are required")
    n_sv = int(ctx.attr("n_supports", 0))
    r0 = np.float32(rho[0] if rho is not None and len(rho) else 0.0)
    one_class = int(ctx.attr("one_class", 0)) != 0
    _, transform = post_transform(ctx)
    if n_sv > 0:
        if sv is None or len(sv) % n_sv:
            raise ctx.unsupported("support_vectors do not split into n_supports vectors")
        kern = _kernel(ctx, sv.reshape(n_sv, -1).T.copy())
        w = coef.reshape(-1, 1).astype(_F32)
    else:
        kern = _kernel(ctx, coef.reshape(-1, 1), linear=True)
        w = None

    def svm_regressor(x: np.ndarray) -> np.ndarray:
        k = kern(_x32(x))
        y = k @ w if w is not None else k
        y += r0
        if one_class:
            y = np.where(y > 0, np.float32(1), np.float32(-1))
        return transform(y)

    return svm_regressor


def _svm_classifier(ctx: KernelContext) -> ComputeFn:
    """SVMClassifier (see the module docstring for the scores and labels)."""
    strs = attr_strings(ctx, "classlabels_strings")
    ints = attr_ints(ctx, "classlabels_ints")
    if strs:
        labels: np.ndarray = np.array(strs, dtype=object)
    elif ints is not None and len(ints):
        labels = ints
    else:
        raise ctx.unsupported("classlabels_ints or classlabels_strings is required")
    k = len(labels)
    coef = attr_floats(ctx, "coefficients", np.float64)
    rho = attr_floats(ctx, "rho", np.float64)
    if coef is None or rho is None:
        raise ctx.unsupported("coefficients and rho are required")
    vpc = attr_ints(ctx, "vectors_per_class")
    n_sv = int(vpc.sum()) if vpc is not None else 0
    prob_a = attr_floats(ctx, "prob_a", np.float64)
    prob_b = attr_floats(ctx, "prob_b", np.float64)
    have_proba = prob_a is not None and len(prob_a) > 0
    tname, transform = post_transform(ctx)
    n_pairs = k * (k - 1) // 2

    if n_sv == 0:  # liblinear mode
        if len(coef) % k:
            raise ctx.unsupported("coefficients do not split into one row per class")
        return _svm_linear(labels, coef, np.float32(rho[0]), transform)

    assert vpc is not None
    sv = attr_floats(ctx, "support_vectors", np.float64)
    if sv is None or len(sv) % n_sv:
        raise ctx.unsupported("support_vectors do not split into vectors_per_class")
    if len(vpc) != k or len(coef) != (k - 1) * n_sv or len(rho) < n_pairs:
        raise ctx.unsupported("vectors_per_class, coefficients and rho do not fit the classes")
    kern = _kernel(ctx, sv.reshape(n_sv, -1).T.copy())
    a32, win_i, win_j = _pairwise(coef.reshape(k - 1, n_sv), vpc)
    rho32 = rho[:n_pairs].astype(_F32)
    if have_proba:
        assert prob_a is not None and prob_b is not None
        pa, pb = prob_a[:n_pairs].astype(_F32), prob_b[:n_pairs].astype(_F32)

    def svm_classifier(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = kern(_x32(x)) @ a32
        d += rho32
        n = d.shape[0]
        votes = np.zeros((n, k), dtype=np.int64)
        pos = d > 0
        rows = np.arange(n)[:, None]
        np.add.at(votes, (rows, np.where(pos, win_i, win_j)), 1)
        label = labels.take(votes.argmax(axis=1))
        if have_proba:
            p = 1 - logistic(d * pa + pb)
            p = np.clip(p, np.float32(1e-7), np.float32(1 - 1e-7))
            return label, transform(_coupling(p, k, win_i, win_j).astype(_F32))
        if n_pairs == 1:
            s = d[:, 0]
            if tname == "PROBIT":
                return label, np.stack([transform(d)[:, 0], np.zeros_like(s)], axis=1)
            first = -s if tname == "NONE" else 1 - s
            return label, np.stack([first, s], axis=1)
        return label, transform(d)

    return svm_classifier


def _svm_linear(
    labels: np.ndarray, coef: np.ndarray, r0: np.float32, transform: Callable[..., np.ndarray]
) -> ComputeFn:
    """SVMClassifier without support vectors (liblinear): scores ``X @ coefficients.T + r0``,
    the label the best class (for two classes: class 1 when the top score wins)."""
    k = len(labels)
    w_t = coef.reshape(k, -1).T.astype(_F32).copy()
    all_positive = bool((coef >= 0).all())
    n_pairs = k * (k - 1) // 2

    def svm_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = _x32(x) @ w_t
        s += r0
        pick = s.argmax(axis=1)
        if n_pairs == 1:
            top = s.max(axis=1)
            win = (top >= 0.5) if all_positive else (top > 0)
            pick = np.where(win, 1, pick)
        return labels.take(pick), transform(s)

    return svm_linear


def _pairwise(coef2: np.ndarray, vpc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A float32 (n_sv, n_pairs), i, j per pair): one-vs-one decision values are one matmul
    ``K @ A + rho`` (libsvm's layout: ``coef2`` (k - 1, n_sv), ``vpc`` vectors per class)."""
    k = len(vpc)
    starts = np.concatenate([[0], np.cumsum(vpc)]).astype(np.int64)
    a = np.zeros((coef2.shape[1], k * (k - 1) // 2), dtype=np.float64)
    pi, pj = [], []
    col = 0
    for i in range(k - 1):
        for j in range(i + 1, k):
            si, sj = slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1])
            a[si, col] = coef2[j - 1, si]
            a[sj, col] = coef2[i, sj]
            pi.append(i)
            pj.append(j)
            col += 1
    return a.astype(_F32), np.asarray(pi), np.asarray(pj)


def _coupling(r_pairs: np.ndarray, k: int, pi: np.ndarray, pj: np.ndarray) -> np.ndarray:
    """libsvm's multiclass probability from pairwise ones (Wu, Lin, Weng 2004, method 2),
    vectorized over rows: r_pairs (N, n_pairs) holds P(class i | i or j) for each pair."""
    n = r_pairs.shape[0]
    r = np.zeros((n, k, k))
    r[:, pi, pj] = r_pairs
    r[:, pj, pi] = 1 - r_pairs
    q = -r.transpose(0, 2, 1) * r  # Q[i, j] = -r[j, i] * r[i, j] off the diagonal
    diag = (r * r).sum(axis=1)  # Q[i, i] = sum over j of r[j, i]^2 (r[i, i] is 0)
    q[:, np.arange(k), np.arange(k)] = diag
    p = np.full((n, k), 1.0 / k)
    eps = 0.005 / k
    active = np.arange(n)
    for _ in range(100):
        qa, pa = q[active], p[active]
        qp = np.einsum("nij,nj->ni", qa, pa)
        pqp = (pa * qp).sum(axis=1)
        err = np.abs(qp - pqp[:, None]).max(axis=1)
        keep = err >= eps
        active, qa, pa, qp, pqp = active[keep], qa[keep], pa[keep], qp[keep], pqp[keep]
        if not len(active):
            break
        for i in range(k):
            qii = qa[:, i, i]
            diff = (-qp[:, i] + pqp) / qii
            pa[:, i] += diff
            den = 1 + diff
            pqp = (pqp + diff * (diff * qii + 2 * qp[:, i])) / den / den
            qp = (qp + diff[:, None] * qa[:, i, :]) / den[:, None]
            pa /= den[:, None]
        p[active] = pa
    return p


def register_kernels(registry: KernelRegistry) -> None:
    """Register SVMClassifier and SVMRegressor."""
    registry.add("SVMClassifier", _svm_classifier, domain=ML_DOMAIN, since=1)
    registry.add("SVMRegressor", _svm_regressor, domain=ML_DOMAIN, since=1)
