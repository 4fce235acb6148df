"""numba kernels for SVMs and linear models, one row at a time (see ``kern_post``).

They follow ``tfrt_py.kernels.ml.svm`` and ``kernels.ml.linear`` and, as it, onnxruntime's
order of operations: kernel values in float32 (RBF's ``sum_i (x_i - s_i)^2`` summed over the
features in order, then libm's correctly rounded ``expf``, ``fastmath.expf_rn``); the
pairwise decision values ``D = K @ A + rho`` as float32 products summed in float64 over the
support vectors in order (the probabilities hang on D's last bits: summed in float32 they
came out 6e-5 from onnxruntime's); probabilities by libsvm's pairwise coupling (Wu, Lin and
Weng 2004, method 2) in float32, in onnxruntime's order. Kernel codes: LINEAR 0, POLY 1,
RBF 2, SIGMOID 3 (``ml_pack.KERNEL_CODES``). Scratch buffers come from the caller's arena.

The SVM kernels say ``fastmath=False``: a numba function that leaves fastmath unset takes
its caller's (``CPUTargetOptions.finalize``), and generated modules compile with
``fastmath={'contract'}``, under which LLVM fuses ``acc += t * t`` into one fused
multiply-add -- not onnxruntime's sums (its loops here are plain C++ built without FMA).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .closure_cache import stamp_with_siblings
from .fastmath import expf_rn, fma, tanhf_mlas
from .post import argmax, logistic, post, probit

__all__ = [
    "linear_cls_row", "linear_cls_rows", "linear_reg_rows", "svm_cls_row", "svm_kernel_row",
    "svm_reg_row",
]  # fmt: skip


@njit(nogil=True, cache=True, fastmath={"contract"})
def _dots_fused(x, xo, f, sv, n_sv, kb):
    """``kb[v] = x[xo:xo + f] . sv[:, v]``, one fused multiply-add chain over the features
    from zero, as MLAS's gemm sums at these widths (onnxruntime's kernel values for
    LINEAR, POLY and SIGMOID are its gemm)."""
    for v in range(n_sv):
        kb[v] = 0
    for i in range(f):
        xi = np.float32(x[xo + i])
        base = i * n_sv
        for v in range(n_sv):
            kb[v] += xi * sv[base + v]


@njit(nogil=True, cache=True, fastmath=False)
def svm_kernel_row(x, xo, f, sv, n_sv, ktype, gamma, coef0, degree, kb):
    """``kb[v] = K(x[xo:xo + f], sv[:, v])`` for every support vector (``sv`` feature-major:
    ``sv[i * n_sv + v]``, so the loops over vectors vectorize), in float32."""
    g = np.float32(gamma)
    c0 = np.float32(coef0)
    if ktype == 2:
        for v in range(n_sv):
            kb[v] = 0
        for i in range(f):
            xi = np.float32(x[xo + i])
            base = i * n_sv
            for v in range(n_sv):
                t = xi - sv[base + v]
                kb[v] += t * t
        ng = np.float32(-gamma)
        for v in range(n_sv):
            kb[v] = expf_rn(kb[v] * ng)
        return
    _dots_fused(x, xo, f, sv, n_sv, kb)
    if ktype == 1:
        for v in range(n_sv):
            k = kb[v] * g + c0
            if degree == 2.0:
                kb[v] = k * k
            elif degree == 3.0:
                kb[v] = k * k * k
            else:
                kb[v] = k ** np.float32(degree)
    elif ktype == 3:  # MLAS: gemm's alpha and C as one fused step, then its tanh
        for v in range(n_sv):
            kb[v] = tanhf_mlas(fma(kb[v], g, c0))  # type: ignore[call-arg]


_ONE = np.float32(1.0)
_TWO = np.float32(2.0)


@njit(nogil=True, cache=True, fastmath=False)
def _pair_probability(score, pa, pb):
    """libsvm's pairwise probability ``1 - sigmoid(score pa + pb)``, clipped to [1e-7,
    1 - 1e-7], in float32 as onnxruntime computes it (``sigmoid_probability``)."""
    v = score * pa + pb
    e = _ONE / (_ONE + expf_rn(-abs(v)))
    r = _ONE - ((_ONE - e) if v < 0 else e)
    return min(max(r, np.float32(1e-7)), np.float32(1 - 1e-7))


@njit(nogil=True, cache=True, fastmath=False)
def _coupling(r, k, q, p, qp):
    """libsvm's multiclass probability from pairwise ``r`` (k x k) into ``p``: float32
    scratch and operations in onnxruntime's order (``multiclass_probability``), whose
    stopping test at 0.005 / k leaves the small probabilities hanging on every rounding."""
    for t in range(k * k):
        q[t] = 0
    for t in range(k):
        p[t] = _ONE / np.float32(k)
        for j in range(k):
            if j < t:
                q[t * k + t] += r[j * k + t] * r[j * k + t]
                q[t * k + j] = q[j * k + t]
            elif j > t:
                q[t * k + t] += r[j * k + t] * r[j * k + t]
                q[t * k + j] = -r[j * k + t] * r[t * k + j]
    eps = np.float32(0.005) / np.float32(k)
    for _ in range(100):
        pqp = np.float32(0.0)
        for t in range(k):
            qp[t] = 0
            for j in range(k):
                qp[t] += q[t * k + j] * p[j]
            pqp += p[t] * qp[t]
        err = np.float32(0.0)
        for t in range(k):
            e = abs(qp[t] - pqp)
            if e > err:
                err = e
        if err < eps:
            break
        for t in range(k):
            qtt = q[t * k + t]
            diff = (-qp[t] + pqp) / qtt
            p[t] += diff
            pqp = (pqp + diff * (diff * qtt + _TWO * qp[t])) / (_ONE + diff) / (_ONE + diff)
            for j in range(k):
                qp[j] = (qp[j] + diff * q[t * k + j]) / (_ONE + diff)
                p[j] /= _ONE + diff


@njit(nogil=True, cache=True, fastmath=False)
def _decisions(kb, a, n_sv, n_pairs, span, d):
    """``d[p] = sum_v kb[v] a(p, v)``, each float32 product added in float64 in vector
    order: onnxruntime's sums (class i's vectors, then class j's; the zero coefficients of
    the other classes add nothing). Pairs go four at a time, ``a`` interleaved for them
    (``a[(b n_sv + v) 4 + j]`` is pair ``4 b + j``'s coefficient of vector ``v``, zero past
    the last pair), over the vectors ``span[2 b]:span[2 b + 1]`` their classes cover: four
    independent sums in registers (a 3-class SVC of 336 vectors: 1.25 -> 0.53 µs a row,
    Zen 4, where one sum a pair in memory waited on its own store)."""
    for b in range(0, (n_pairs + 3) // 4):
        s0 = s1 = s2 = s3 = 0.0
        base = np.uint64(b) * np.uint64(n_sv) * np.uint64(4)
        for v in range(span[2 * b], span[2 * b + 1]):
            kv = kb[np.uint64(v)]
            o = base + np.uint64(v) * np.uint64(4)
            s0 += kv * a[o]
            s1 += kv * a[o + np.uint64(1)]
            s2 += kv * a[o + np.uint64(2)]
            s3 += kv * a[o + np.uint64(3)]
        p = 4 * b
        d[p] = s0
        if p + 1 < n_pairs:
            d[p + 1] = s1
        if p + 2 < n_pairs:
            d[p + 2] = s2
        if p + 3 < n_pairs:
            d[p + 3] = s3


@njit(nogil=True, cache=True, fastmath=False)
def svm_cls_row(x, xo, f, sv, n_sv, ktype, gamma, coef0, degree, a, span, rho, pi, pj, k,
                labels, proba, pa, pb, code, kb, d, sc, votes, lab, lo, y, yo):  # fmt: skip
    """SVMClassifier (one-vs-one with support vectors): ``lab[lo]`` the class with most
    pairwise votes, ``y[yo:]`` the probabilities (``proba``), else the decision values
    (two columns for two classes). ``d`` is float64 (n_pairs,) scratch: each pair's float32
    products summed in float64, rounded to float32 after ``rho`` (the votes see the float64
    sum), as onnxruntime does."""
    n_pairs = rho.size
    svm_kernel_row(x, xo, f, sv, n_sv, ktype, gamma, coef0, degree, kb)
    _decisions(kb, a, n_sv, n_pairs, span, d)
    for c in range(k):
        votes[c] = 0
    for p in range(n_pairs):
        d[p] += rho[p]
        win = d[p] > 0
        d[p] = np.float32(d[p])
        if win:
            votes[pi[p]] += 1
        else:
            votes[pj[p]] += 1
    lab[lo] = labels[argmax(votes, 0, k)]
    if proba:
        kk = k * k
        for p in range(n_pairs):
            r = _pair_probability(np.float32(d[p]), pa[p], pb[p])
            sc[pi[p] * k + pj[p]] = r
            sc[pj[p] * k + pi[p]] = _ONE - r
        _coupling(sc, k, sc[kk : 2 * kk], sc[2 * kk : 2 * kk + k], sc[2 * kk + k : 2 * kk + 2 * k])
        for c in range(k):
            y[yo + c] = sc[2 * kk + c]
        post(y, yo, k, code)
        return
    if n_pairs == 1:
        s = np.float32(d[0])
        if code == 4:
            y[yo] = probit(float(s))
            y[yo + 1] = 0
        else:
            y[yo] = -s if code == 0 else np.float32(1.0) - s
            y[yo + 1] = s
        return
    for p in range(n_pairs):
        y[yo + p] = d[p]
    post(y, yo, n_pairs, code)


@njit(nogil=True, cache=True)
def svm_reg_row(x, xo, f, sv, n_sv, ktype, gamma, coef0, degree, coef, r0, one_class, code, kb,
                y, yo):  # fmt: skip
    """SVMRegressor: ``y[yo] = K(x, S) @ coef + rho[0]`` (float32); one_class gives +1/-1."""
    svm_kernel_row(x, xo, f, sv, n_sv, ktype, gamma, coef0, degree, kb)
    s = np.float32(0.0)
    for v in range(n_sv):
        s += kb[v] * coef[v]
    s += r0
    if one_class:
        s = np.float32(1.0) if s > 0 else np.float32(-1.0)
    y[yo] = s
    post(y, yo, 1, code)


@njit(nogil=True, cache=False, inline="always")
def linear_cls_row(x, xo, f, w, b, n, labels, binary, two, pos, neg, lin_argmax, all_positive,
                   code, s, lab, lo, y, yo):  # fmt: skip
    """LinearClassifier (``binary``: one coefficient row, ORT's binary form) and, with
    ``lin_argmax``, SVMClassifier's liblinear mode (``b`` one rho for every class):
    ``s = x @ w + b`` (w row-major (f, n)), ``lab[lo]`` and the scores ``y[yo:]``."""
    for j in range(n):
        s[j] = 0
    for i in range(f):
        xi = np.float32(x[xo + i])
        for j in range(n):
            s[j] += xi * w[i * n + j]
    _linear_cls_finish(s, 0, b, n, labels, binary, two, pos, neg, lin_argmax, all_positive,
                       code, lab, lo, y, yo)  # fmt: skip


@njit(nogil=True, cache=False, inline="always")
def linear_cls_rows(x, xo, rows, f, w, b, n, labels, binary, two, pos, neg, lin_argmax,
                    all_positive, code, s, lab, lo, y, yo):  # fmt: skip
    """``linear_cls_row`` for ``rows`` consecutive rows: row ``r`` read at ``xo + r * f``,
    its label written at ``lab[lo + r]`` and its scores at ``y[yo + r * width]`` (width 2
    for a binary classifier of two labels, 1 for other binary ones, else ``n``). Rows eight
    at a time: eight independent chains of sums (one row's multiply-adds wait on each
    other; two FMA pipes of latency 4 need eight), each in the one-row order, so the same
    float32 bits; each row finished by ``_linear_cls_finish``, inlined as the rows loop is
    (a call with arrays costs their reference counts' atomic updates). The last rows, and
    liblinear SVM rows, one at a time. ``s``: scratch of ``8 * n``."""
    width = (2 if two else 1) if binary else n
    blocked = rows - rows % 8 if not lin_argmax else 0
    for r in range(0, blocked, 8):
        p = xo + r * f
        for j in range(n):
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
            for i in range(f):
                wij = w[i * n + j]
                a0 += np.float32(x[p + i]) * wij
                a1 += np.float32(x[p + f + i]) * wij
                a2 += np.float32(x[p + 2 * f + i]) * wij
                a3 += np.float32(x[p + 3 * f + i]) * wij
                a4 += np.float32(x[p + 4 * f + i]) * wij
                a5 += np.float32(x[p + 5 * f + i]) * wij
                a6 += np.float32(x[p + 6 * f + i]) * wij
                a7 += np.float32(x[p + 7 * f + i]) * wij
            s[j] = a0
            s[n + j] = a1
            s[2 * n + j] = a2
            s[3 * n + j] = a3
            s[4 * n + j] = a4
            s[5 * n + j] = a5
            s[6 * n + j] = a6
            s[7 * n + j] = a7
        for q in range(8):
            rq = r + q
            _linear_cls_finish(s, q * n, b, n, labels, binary, two, pos, neg, lin_argmax,
                               all_positive, code, lab, lo + rq, y, yo + rq * width)  # fmt: skip
    for r in range(blocked, rows):
        linear_cls_row(x, xo + r * f, f, w, b, n, labels, binary, two, pos, neg, lin_argmax,
                       all_positive, code, s, lab, lo + r, y, yo + r * width)  # fmt: skip


@njit(nogil=True, cache=True)
def linear_reg_rows(x, xo, rows, f, w, b, t, code, y, yo):
    """LinearRegressor's ``rows`` consecutive rows: ``y[yo + r * t:][:t] = x_r @ w + b``
    (w row-major (f, t)), then post transform ``code``; four rows' sums at once, each in
    ``post.matvec``'s order (the one-row body's bits: neither is inlined, so neither is
    contracted to fused multiply-adds)."""
    blocked = rows - rows % 4
    for r in range(0, blocked, 4):
        p = xo + r * f
        o = yo + r * t
        for j in range(t):
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for i in range(f):
                wij = w[i * t + j]
                a0 += np.float32(x[p + i]) * wij
                a1 += np.float32(x[p + f + i]) * wij
                a2 += np.float32(x[p + 2 * f + i]) * wij
                a3 += np.float32(x[p + 3 * f + i]) * wij
            y[o + j] = a0 + b[j]
            y[o + t + j] = a1 + b[j]
            y[o + 2 * t + j] = a2 + b[j]
            y[o + 3 * t + j] = a3 + b[j]
    for r in range(blocked, rows):
        o = yo + r * t
        for j in range(t):
            a = np.float32(0.0)
            for i in range(f):
                a += np.float32(x[xo + r * f + i]) * w[i * t + j]
            y[o + j] = a + b[j]
    if code != 0:
        for r in range(rows):
            post(y, yo + r * t, t, code)


@njit(nogil=True, cache=False, inline="always")
def _linear_cls_finish(s, so, b, n, labels, binary, two, pos, neg, lin_argmax, all_positive,
                       code, lab, lo, y, yo):  # fmt: skip
    """One row's sums ``s[so:so + n]`` plus the intercepts -> its label and scores."""
    for j in range(n):
        s[so + j] += b[j if b.size == n else 0]
    if binary:
        s0 = s[so]
        lab[lo] = pos if s0 > 0 else neg
        if code == 4:
            s0 = np.float32(probit(float(s0)))
        if not two:
            y[yo] = s0
        elif code == 2:
            y[yo] = logistic(-float(s[so]))
            y[yo + 1] = logistic(float(s[so]))
        else:
            y[yo] = np.float32(1.0) - s0
            y[yo + 1] = s0
        return
    pick = argmax(s, so, n)
    if lin_argmax and n == 2:
        top = max(s[so], s[so + 1])
        if (top >= 0.5) if all_positive else (top > 0):
            pick = 1
    lab[lo] = labels[pick]
    for j in range(n):
        y[yo + j] = s[so + j]
    post(y, yo, n, code)


stamp_with_siblings(globals())
