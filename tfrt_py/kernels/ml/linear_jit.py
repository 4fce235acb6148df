"""A compiled LinearClassifier pass (logistic regression's export): each row's dot
products with the coefficient rows, the intercepts, the label's index and the scores'
post transform in one pass. NumPy's form is ten calls of ~1 µs each on the one-row calls a
served model gets (a product, an add, an argmax, a take, the transform's four or five).

``linear_classifier()`` gives ``fn(x, w, b, mode, idx, scores)``: ``x`` a C-contiguous
(N, K) float32 array, ``w`` (C, K) and ``b`` (C,) float32; writes ``idx[i]`` (int64) and
``scores[i]`` (float32) as ``linear._linear_classifier``'s NumPy path does, all in
float32 (the transforms as ``common``'s: ``_logistic``, ``_softmax``):

* ``MULTI`` + 0/1/2 (NONE, LOGISTIC, SOFTMAX): C scores, ``idx`` the first maximum of the
  untransformed scores (a NaN counts as the maximum, as ``argmax``);
* ``BINARY`` + 0/1 (NONE, LOGISTIC), C = 1 with two labels: ``idx`` 1 where the score
  ``s`` > 0, scores ``[1 - s, s]`` or ``[sigmoid(-s), sigmoid(s)]``.

None without numba (``jit.py``): the caller keeps NumPy's calls. Any thread (no GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted

__all__ = [
    "BINARY", "LOGISTIC", "MAX_MACS", "MULTI", "NONE", "NORMS", "SOFTMAX", "linear_classifier",
    "normalizer",
]  # fmt: skip

NONE, LOGISTIC, SOFTMAX = 0, 1, 2
#: Bigger products go to BLAS (the pass's dot products are plain loops): a batch of 1000
#: rows by 20 features by 3 classes is 60k.
MAX_MACS = 1 << 16
MULTI, BINARY = 0, 8


def _sigmoid(v: Any) -> Any:  # pragma: no cover - numba only
    e = np.exp(-abs(v))
    d = e + np.float32(1.0)
    return e / d if v < 0 else np.float32(1.0) / d


def _linear_classifier(
    x: Any, w: Any, b: Any, mode: int, idx: Any, scores: Any
) -> None:  # pragma: no cover - numba only
    n, k = x.shape
    c = w.shape[0]
    how = mode & 7
    one = np.float32(1.0)
    # the scores four rows at a time: four independent sums (one sum's adds wait on each
    # other), each in the order of the one-row loop below, so the same float32 bits
    blocked = n - n % 4
    for i in range(0, blocked, 4):
        for r in range(c):
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for j in range(k):
                wj = w[r, j]
                a0 += x[i, j] * wj
                a1 += x[i + 1, j] * wj
                a2 += x[i + 2, j] * wj
                a3 += x[i + 3, j] * wj
            scores[i, r] = a0 + b[r]
            scores[i + 1, r] = a1 + b[r]
            scores[i + 2, r] = a2 + b[r]
            scores[i + 3, r] = a3 + b[r]
    for i in range(blocked, n):
        for r in range(c):
            acc = np.float32(0.0)
            for j in range(k):
                acc += x[i, j] * w[r, j]
            scores[i, r] = acc + b[r]
    for i in range(n):
        if mode & BINARY:
            s = scores[i, 0]
            idx[i] = 1 if s > 0 else 0
            if how == LOGISTIC:
                scores[i, 0] = _sigmoid(-s)
                scores[i, 1] = _sigmoid(s)
            else:
                scores[i, 0] = one - s
                scores[i, 1] = s
            continue
        best = 0
        bv = scores[i, 0]
        for r in range(1, c):
            v = scores[i, r]
            if bv == bv and (v > bv or v != v):
                best, bv = r, v
        idx[i] = best
        if how == LOGISTIC:
            for r in range(c):
                scores[i, r] = _sigmoid(scores[i, r])
        elif how == SOFTMAX:
            mx = scores[i, 0]
            for r in range(1, c):
                mx = max(mx, scores[i, r])
            tot = np.float32(0.0)
            for r in range(c):
                e = np.exp(scores[i, r] - mx)
                scores[i, r] = e
                tot += e
            for r in range(c):
                scores[i, r] = scores[i, r] / tot


def _warm(fn: Any) -> None:
    x = np.ones((1, 2), np.float32)
    for mode in (MULTI | NONE, BINARY | LOGISTIC):
        fn(x, np.ones((1, 2), np.float32), np.ones(1, np.float32), mode,
           np.empty(1, np.int64), np.empty((1, 2), np.float32))  # fmt: skip


_LINEAR_CLASSIFIER = Jitted(_linear_classifier, _warm, helpers=(_sigmoid,))


def linear_classifier() -> Any:
    """The compiled pass, or None (numba missing or ``$TFRT_PY_JIT=0``)."""
    return _LINEAR_CLASSIFIER.get()


#: Normalizer's norms as the compiled pass's codes.
NORMS = {"MAX": 0, "L1": 1, "L2": 2}


def _normalize_rows(x: Any, norm: int, out: Any) -> None:  # pragma: no cover - numba only
    """``out[i] = x[i] / d`` with ``d`` the row's MAX (of its non-NaN values), L1 or L2
    norm (summed in float64, then float32), and 1 where that is 0: ``linear._normalizer``'s
    NumPy path."""
    n, k = x.shape
    for i in range(n):
        if norm == 0:  # onnxruntime's std::max from float's lowest: NaNs are skipped
            d = np.float32(-3.4028234663852886e38)
            for j in range(k):
                v = x[i, j]
                if v > d:
                    d = v
        else:
            acc = 0.0  # float64: a long sparse row (a TF-IDF vocabulary) keeps its digits
            for j in range(k):
                v = np.float64(x[i, j])
                acc += abs(v) if norm == 1 else v * v
            d = np.float32(acc) if norm == 1 else np.float32(np.sqrt(acc))
        if d == 0:
            d = np.float32(1.0)
        for j in range(k):
            out[i, j] = x[i, j] / d


def _warm_normalize(fn: Any) -> None:
    for norm in NORMS.values():
        fn(np.ones((1, 2), np.float32), norm, np.empty((1, 2), np.float32))


_NORMALIZE = Jitted(_normalize_rows, _warm_normalize)


def normalizer() -> Any:
    """The compiled Normalizer pass, or None (numba missing or ``$TFRT_PY_JIT=0``)."""
    return _NORMALIZE.get()
