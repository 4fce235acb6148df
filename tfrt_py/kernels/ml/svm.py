"""Kernels (ml): support vector machines -- SVMClassifier and SVMRegressor.

Kernels (``kernel_params`` = gamma, coef0, degree): LINEAR ``x.s``, POLY
``(gamma x.s + coef0) ** degree``, RBF ``exp(-gamma |x - s|^2)``, SIGMOID
``tanh(gamma x.s + coef0)``. Without support vectors the model is linear
(``X @ coefficients.T + rho[0]``). Computation is float32, as onnxruntime's, and where the
probabilities hang on the last bits, in its order: RBF's ``sum_i (x_i - s_i)^2`` in float32
over the features in order and a correctly rounded ``exp``; the one-vs-one decision values
summed in float64 and rounded once; SIGMOID's ``gamma k + coef0`` fused and its ``tanh``
MLAS's rational polynomial (libm's tanh left 24% of the scores off by up to 1.1e-5
relative); the pair probabilities and libsvm's coupling in float32, operation for
operation (``native.kernels.svm`` does the same per row). Done in float64 or in another
order, the coupling's probabilities came out 6e-5 from onnxruntime's.

SVMClassifier (one-vs-one, libsvm layout): scores are the pairwise decision values
(``2`` columns for two classes), or with ``prob_a``/``prob_b`` the class probabilities by
libsvm's pairwise coupling; the label is the class with most pairwise votes. Outputs
(label int64 or string (N,), scores float32). SVMRegressor gives float32 (N, 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..lib.jit import CONTRACT, Jitted
from ..lib.mlas_tanh import fma32, tanh_mlas
from ..registry import KernelRegistry
from .common import ML_DOMAIN, as_2d, attr_floats, attr_ints, attr_strings, post_transform

__all__ = ["register_kernels"]

_F32 = np.dtype(np.float32)
_ONE = np.float32(1.0)
_TWO = np.float32(2.0)
#: rows of RBF distances a pass: (rows, features, vectors) float32 stays a few MB
_RBF_ROWS = 64


def _exp_rounded(a: np.ndarray) -> np.ndarray:
    """e**a for float32 ``a`` as libm's correctly rounded ``expf`` (onnxruntime's): float64
    exp rounded once."""
    return np.exp(a.astype(np.float64)).astype(_F32)


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
    dots_fn = _DOTS.get() if kind != "RBF" else None  # at load, not per call; RBF: none

    def dots(x: np.ndarray) -> np.ndarray:
        return _fused_dots(x, s_t, dots_fn)

    if kind == "LINEAR":
        return dots

    if kind == "POLY":

        def poly(x: np.ndarray) -> np.ndarray:
            k = dots(x)
            k *= g
            k += c
            return k * k if d == 2.0 else (k * k * k if d == 3.0 else k**d)

        return poly
    if kind == "SIGMOID":

        def sigmoid(x: np.ndarray) -> np.ndarray:  # MLAS: gemm's alpha and C fused
            return tanh_mlas(fma32(dots(x), g, c))

        return sigmoid
    if kind == "RBF":
        s_f = s_t64.astype(_F32)  # (F, V)
        ng = -np.float32(gamma)

        def rbf(x: np.ndarray) -> np.ndarray:
            n = x.shape[0]
            dist = np.empty((n, s_f.shape[1]), dtype=_F32)
            for r0 in range(0, n, _RBF_ROWS):
                t = x[r0 : r0 + _RBF_ROWS, :, None] - s_f  # (rows, F, V)
                t *= t
                np.add.reduce(t, axis=1, out=dist[r0 : r0 + _RBF_ROWS])  # over F in order
            dist *= ng
            return _exp_rounded(dist)

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

    chain = _DOTS.get() if w is not None else None  # at load, not per call

    def svm_regressor(x: np.ndarray) -> np.ndarray:
        k = kern(_x32(x))
        y = _fused_dots(k, w, chain) if w is not None else k
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
    rho64 = rho[:n_pairs].astype(_F32).astype(np.float64)
    if have_proba:
        assert prob_a is not None and prob_b is not None
        pa, pb = prob_a[:n_pairs].astype(_F32), prob_b[:n_pairs].astype(_F32)

    def svm_classifier(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d64 = _decisions(kern(_x32(x)), a32)
        d64 += rho64
        pos = d64 > 0
        d = d64.astype(_F32)
        n = d.shape[0]
        votes = np.zeros((n, k), dtype=np.int64)
        rows = np.arange(n)[:, None]
        np.add.at(votes, (rows, np.where(pos, win_i, win_j)), 1)
        label = labels.take(votes.argmax(axis=1))
        if have_proba:
            return label, transform(_coupling(_pair_probability(d, pa, pb), k, win_i, win_j))
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


def _decisions(kv: np.ndarray, a32: np.ndarray) -> np.ndarray:
    """``kv @ a32`` (N, n_pairs) float64 as onnxruntime sums it: float32 products, summed in
    float64 over the support vectors in order (``a32``'s zeros add nothing; with one pair
    NumPy's reduction is pairwise, which moves a float64 sum by an ulp or so)."""
    n = kv.shape[0]
    d = np.empty((n, a32.shape[1]), dtype=np.float64)
    for r0 in range(0, n, _RBF_ROWS):
        prod = kv[r0 : r0 + _RBF_ROWS, :, None] * a32  # (rows, V, pairs) float32
        np.add.reduce(prod, axis=1, dtype=np.float64, out=d[r0 : r0 + _RBF_ROWS])
    return d


def _dots_rows(x: np.ndarray, s_t: np.ndarray, k: np.ndarray) -> None:  # pragma: no cover
    """numba (``CONTRACT``): ``k[r, v] = x[r] . s_t[:, v]``, one fused multiply-add chain
    over the features from zero (the loop over vectors vectorizes)."""
    for r in range(x.shape[0]):
        for v in range(s_t.shape[1]):
            k[r, v] = 0.0
        for i in range(x.shape[1]):
            xi = x[r, i]
            for v in range(s_t.shape[1]):
                k[r, v] += xi * s_t[i, v]


def _warm_dots(fn: Any) -> None:
    x = np.ones((2, 3), np.float32)
    for writeable in (True, False):  # a caller's feed may be read-only
        x.flags.writeable = writeable
        fn(x, np.ones((3, 4), np.float32), np.empty((2, 4), np.float32))


_DOTS = Jitted(_dots_rows, _warm_dots, fastmath=CONTRACT)


def _fused_dots(x: np.ndarray, s_t: np.ndarray, fn: Any) -> np.ndarray:
    """``x @ s_t`` (N, V) float32 as MLAS's gemm sums it for onnxruntime's LINEAR, POLY and
    SIGMOID kernel values and SVMRegressor's sum over the support vectors
    (``native.kernels.svm._dots_fused``'s order; OpenBLAS's differed on a Zen 3 host, 5e-6
    relative); ``fn``: ``_DOTS``' dispatcher, None without numba (NumPy's gemm)."""
    if fn is None:
        return x @ s_t
    k = np.empty((x.shape[0], s_t.shape[1]), dtype=_F32)
    fn(np.ascontiguousarray(x), s_t, k)
    return k


def _pair_probability(d: np.ndarray, pa: np.ndarray, pb: np.ndarray) -> np.ndarray:
    """libsvm's ``1 - sigmoid(d pa + pb)`` per pair, clipped to [1e-7, 1 - 1e-7], in float32
    as onnxruntime's ``sigmoid_probability``."""
    v = d * pa
    v += pb
    e = _exp_rounded(-np.abs(v))
    e += _ONE
    np.divide(_ONE, e, out=e)
    r = _ONE - np.where(v < 0, _ONE - e, e)
    return np.clip(r, np.float32(1e-7), np.float32(1 - 1e-7))


def _coupling(r_pairs: np.ndarray, k: int, pi: np.ndarray, pj: np.ndarray) -> np.ndarray:
    """libsvm's multiclass probability from pairwise ones (Wu, Lin, Weng 2004, method 2),
    float32 (N, k) from r_pairs float32 (N, n_pairs) holding P(class i | i or j) for each
    pair: onnxruntime's ``multiclass_probability`` operation for operation (every sum in
    its order), vectorized over the rows; a row stops when it converges."""
    n = r_pairs.shape[0]
    r = np.zeros((n, k, k), dtype=_F32)
    r[:, pi, pj] = r_pairs
    r[:, pj, pi] = _ONE - r_pairs
    q = -r.transpose(0, 2, 1) * r  # Q[i, j] = -r[j, i] r[i, j] off the diagonal
    diag = np.zeros((n, k), dtype=_F32)
    for j in range(k):  # Q[i, i] = sum over j of r[j, i]^2, j in order (r[i, i] adds 0)
        diag += r[:, j, :] * r[:, j, :]
    q[:, np.arange(k), np.arange(k)] = diag
    p = np.full((n, k), _ONE / np.float32(k), dtype=_F32)
    eps = np.float32(0.005) / np.float32(k)
    active = np.arange(n)
    for _ in range(100):
        qa, pa = q[active], p[active]
        qp = np.zeros_like(pa)
        for j in range(k):  # Qp[i] = sum over j of Q[i, j] p[j], j in order
            qp += qa[:, :, j] * pa[:, j : j + 1]
        pqp = np.zeros(len(active), dtype=_F32)
        for i in range(k):
            pqp += pa[:, i] * qp[:, i]
        err = np.abs(qp - pqp[:, None]).max(axis=1)
        keep = err >= eps
        active, qa, pa, qp, pqp = active[keep], qa[keep], pa[keep], qp[keep], pqp[keep]
        if not len(active):
            break
        for i in range(k):
            qii = qa[:, i, i]
            diff = (pqp - qp[:, i]) / qii
            pa[:, i] += diff
            den = _ONE + diff
            pqp = (pqp + diff * (diff * qii + _TWO * qp[:, i])) / den / den
            qp = (qp + diff[:, None] * qa[:, i, :]) / den[:, None]
            pa /= den[:, None]
        p[active] = pa
    return p


def register_kernels(registry: KernelRegistry) -> None:
    """Register SVMClassifier and SVMRegressor."""
    registry.add("SVMClassifier", _svm_classifier, domain=ML_DOMAIN, since=1)
    registry.add("SVMRegressor", _svm_regressor, domain=ML_DOMAIN, since=1)
