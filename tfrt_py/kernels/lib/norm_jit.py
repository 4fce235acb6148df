"""Compiled one-pass LayerNormalization and RMS normalization over the rows of a matrix,
used by the LayerNormalization and RMSNormalization kernels (and so by the decomposed
pattern ``fuse_transformer`` folds into LayerNormalization) and by onnxruntime's fused
normalizations (``contrib/norm``). ``rms_norm_rows`` is the same without the mean and the
bias.

``layer_norm_rows()`` (asked at load) gives ``fn(x, scale, bias, eps, y)``: ``x`` and ``y``
C-contiguous 2-D arrays of one dtype (float32 or float64, distinct buffers), ``scale`` and
``bias`` 1-D of that dtype and length ``cols`` (``bias`` length 0: none); row by row,
``y = (x - mean) / sqrt(var + eps) * scale + bias`` with the row's mean and (biased)
variance.

* float32: the row's sum and sum of squares are accumulated in float64 in one pass (four
  partial sums each, so the adds pipeline; strict IEEE order otherwise), as onnxruntime's
  CPU kernel does; the normalization then runs in float32. NumPy's formulation (a BLAS
  row sum, a subtraction, an einsum, five more passes) took 10.8 µs on a (16, 128) input
  where this takes 1.3 µs (anchor machine), 34 µs vs 17 µs on (197, 192).
* float64: two passes (mean, then the centered squares), every operation in float64, so
  the variance keeps full precision when the mean is large.

Results agree with the NumPy path to a few ulps of the dtype. None when numba is unavailable
(``kernels/lib/jit.py``): the caller runs NumPy. Any thread (releases the GIL).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .jit import Jitted, inline

__all__ = ["embed_norm_rows_f32", "layer_norm_rows", "rms_norm_rows", "skip_norm_rows_f32"]


def _row_sums(xi: Any, n: int) -> tuple[float, float]:  # pragma: no cover - numba only
    """(sum, sum of squares) of a float32 row in float64, four partial sums each (the
    adds pipeline; their order is fixed, so results are deterministic)."""
    n4 = n - n % 4
    s0 = s1 = s2 = s3 = 0.0
    q0 = q1 = q2 = q3 = 0.0
    for j in range(0, n4, 4):
        a0 = np.float64(xi[j])
        a1 = np.float64(xi[j + 1])
        a2 = np.float64(xi[j + 2])
        a3 = np.float64(xi[j + 3])
        s0 += a0
        s1 += a1
        s2 += a2
        s3 += a3
        q0 += a0 * a0
        q1 += a1 * a1
        q2 += a2 * a2
        q3 += a3 * a3
    for j in range(n4, n):
        a0 = np.float64(xi[j])
        s0 += a0
        q0 += a0 * a0
    return (s0 + s1) + (s2 + s3), (q0 + q1) + (q2 + q3)


@inline
def _f32_scale(s: float, q: float, inv_n: float, eps: float) -> Any:  # pragma: no cover
    """(mean, 1 / sqrt(var + eps)) in float32 from a float32 row's float64 (sum, sum of
    squares); a negative rounding of the variance counts as 0. Inlined (``jit.inline``)."""
    mean = s * inv_n
    var = max(q * inv_n - mean * mean, 0.0)
    return np.float32(mean), np.float32(1.0 / math.sqrt(var + eps))


@inline
def _normalize_row(xi: Any, yi: Any, m: Any, inv: Any, scale: Any, bias: Any,
                   has_b: bool, n: int) -> None:  # pragma: no cover - numba only  # fmt: skip
    """``yi = (xi - m) * inv * scale (+ bias)``, in that order of operations (``xi`` may
    be ``yi``). Inlined (``jit.inline``): each loop compiles as if written in the caller."""
    if has_b:
        for j in range(n):
            yi[j] = (xi[j] - m) * inv * scale[j] + bias[j]
    else:
        for j in range(n):
            yi[j] = (xi[j] - m) * inv * scale[j]


def _ln_f32(x: Any, scale: Any, bias: Any, eps: float, y: Any) -> None:  # pragma: no cover
    rows, n = x.shape
    has_b = bias.shape[0] > 0
    inv_n = 1.0 / n
    for i in range(rows):
        xi = x[i]
        yi = y[i]
        s, q = _row_sums(xi, n)
        m, inv = _f32_scale(s, q, inv_n, eps)
        _normalize_row(xi, yi, m, inv, scale, bias, has_b, n)


@inline
def _ln_f64_row(xi: Any, yi: Any, scale: Any, bias: Any, has_b: bool, n: int,
                eps: float) -> None:  # pragma: no cover - numba only  # fmt: skip
    """One float64 row: the mean, then the centered squares (two passes, so the variance
    keeps full precision when the mean is large), then ``_normalize_row``."""
    inv_n = 1.0 / n
    s = 0.0
    for j in range(n):
        s += xi[j]
    mean = s * inv_n
    v = 0.0
    for j in range(n):
        d = xi[j] - mean
        v += d * d
    inv = 1.0 / math.sqrt(v * inv_n + eps)
    _normalize_row(xi, yi, mean, inv, scale, bias, has_b, n)


def _ln_f64(x: Any, scale: Any, bias: Any, eps: float, y: Any) -> None:  # pragma: no cover
    rows, n = x.shape
    for i in range(rows):
        _ln_f64_row(x[i], y[i], scale, bias, bias.shape[0] > 0, n, eps)


def _rms_f32(x: Any, scale: Any, eps: float, y: Any) -> None:  # pragma: no cover
    rows, n = x.shape
    inv_n = 1.0 / n
    for i in range(rows):
        xi = x[i]
        yi = y[i]
        _, q = _row_sums(xi, n)
        inv = np.float32(1.0 / math.sqrt(q * inv_n + eps))
        for j in range(n):
            yi[j] = xi[j] * inv * scale[j]


def _rms_f64(x: Any, scale: Any, eps: float, y: Any) -> None:  # pragma: no cover
    rows, n = x.shape
    inv_n = 1.0 / n
    for i in range(rows):
        xi = x[i]
        yi = y[i]
        q = 0.0
        for j in range(n):
            q += xi[j] * xi[j]
        inv = 1.0 / math.sqrt(q * inv_n + eps)
        for j in range(n):
            yi[j] = xi[j] * inv * scale[j]


def _skip_norm_f32(x: Any, skip: Any, bias: Any, scale: Any, beta: Any, eps: float, y: Any,
                   total: Any, rms: bool) -> None:  # pragma: no cover - numba only  # fmt: skip
    """onnxruntime's SkipLayerNormalization (``rms``: SkipSimplified...) over float32 rows:
    ``s = x + skip (+ bias)`` in float32 (into ``total`` when it has rows: the op's
    input_skip_bias_sum; else into ``y`` as scratch), then ``s``'s LayerNorm (``rms``: RMS
    norm, no mean, no beta) into ``y`` as ``_ln_f32`` / ``_rms_f32`` compute it. ``bias``,
    ``beta`` length 0: none. One pass over the inputs instead of NumPy's add, copy and
    a separate norm call (~14 -> ~3 µs for (16, 128)). The row's normalization is
    ``_ln_f32``'s, inlined (an out-of-line shared row helper measured 12-20% slower:
    LayerNorm (512, 128) 45 -> 54 µs)."""
    rows, n = x.shape
    has_bias = bias.shape[0] > 0
    has_beta = beta.shape[0] > 0 and not rms
    keep = total.shape[0] > 0
    inv_n = 1.0 / n
    for i in range(rows):
        xi, ki, yi = x[i], skip[i], y[i]
        si = total[i] if keep else yi
        if has_bias:
            for j in range(n):
                si[j] = xi[j] + ki[j] + bias[j]
        else:
            for j in range(n):
                si[j] = xi[j] + ki[j]
        sm, q = _row_sums(si, n)
        if rms:
            inv = np.float32(1.0 / math.sqrt(q * inv_n + eps))
            for j in range(n):
                yi[j] = si[j] * inv * scale[j]
            continue
        m, inv = _f32_scale(sm, q, inv_n, eps)
        if has_beta:  # (written out: ``_normalize_row`` inlined here measured 8-10% slower)
            for j in range(n):
                yi[j] = (si[j] - m) * inv * scale[j] + beta[j]
        else:
            for j in range(n):
                yi[j] = (si[j] - m) * inv * scale[j]


def _warm_skip(fn: Any) -> None:
    x = np.zeros((1, 4), np.float32)
    one, none = np.ones(4, np.float32), np.zeros(0, np.float32)
    for rms in (False, True):
        fn(x, x, none, one, one, 1e-5, np.empty_like(x), np.empty_like(x), rms)
        fn(x, x, one, one, none, 1e-5, np.empty_like(x), np.zeros((0, 4), np.float32), rms)


#: What the float32 row kernels call: the sums out of line, the rest inlined.
_F32_ROW = (_row_sums, _f32_scale, _normalize_row)

_SKIP_NORM = Jitted(_skip_norm_f32, _warm_skip, helpers=_F32_ROW)


def skip_norm_rows_f32() -> Any:
    """``fn(x, skip, bias, scale, beta, eps, y, total, rms)`` (``_skip_norm_f32``) for
    float32 2-D C-contiguous ``x``, ``skip``, ``y`` (and ``total``, or a (0, n) array),
    or None without numba."""
    return _SKIP_NORM.get()


def _embed_norm_f32(ids: Any, seg_ids: Any, pos_ids: Any, word: Any, pos: Any, seg: Any,
                    scale: Any, beta: Any, eps: float, y: Any,
                    total: Any) -> int:  # pragma: no cover - numba only  # fmt: skip
    """onnxruntime's EmbedLayerNormalization over float32 tables: for token (i, t) of
    ``ids`` (B, S), ``e = word[ids] + pos[pos_ids or t] (+ seg[seg_ids])`` (into ``total``
    row ``i * S + t`` when it has rows, else into ``y`` as scratch), then its LayerNorm
    into ``y`` as ``_ln_f32`` computes it. ``seg_ids``/``pos_ids`` with no rows: none
    (``pos_ids`` (1, S) is shared by the batch). Every id is checked first; returns 0, or
    1 (input_ids), 2 (segment_ids), 3 (position_ids) out of range, 4 (a sequence longer
    than ``pos``), and then writes nothing."""
    b, s = ids.shape
    h = word.shape[1]
    has_seg = seg_ids.shape[0] > 0
    has_pos = pos_ids.shape[0] > 0
    keep = total.shape[0] > 0
    for i in range(b):
        for t in range(s):
            if ids[i, t] < 0 or ids[i, t] >= word.shape[0]:
                return 1
    if has_pos:
        for i in range(pos_ids.shape[0]):
            for t in range(s):
                if pos_ids[i, t] < 0 or pos_ids[i, t] >= pos.shape[0]:
                    return 3
    elif s > pos.shape[0]:
        return 4
    if has_seg:
        for i in range(b):
            for t in range(s):
                if seg_ids[i, t] < 0 or seg_ids[i, t] >= seg.shape[0]:
                    return 2
    inv_n = 1.0 / h
    shared = has_pos and pos_ids.shape[0] == 1
    for i in range(b):
        for t in range(s):
            r = i * s + t
            yi = y[r]
            ei = total[r] if keep else yi
            wr = word[ids[i, t]]
            pr = pos[(pos_ids[0, t] if shared else pos_ids[i, t]) if has_pos else t]
            if has_seg:
                sr = seg[seg_ids[i, t]]
                for j in range(h):
                    ei[j] = (wr[j] + pr[j]) + sr[j]
            else:
                for j in range(h):
                    ei[j] = wr[j] + pr[j]
            sm, q = _row_sums(ei, h)
            m, inv = _f32_scale(sm, q, inv_n, eps)
            _normalize_row(ei, yi, m, inv, scale, beta, True, h)
    return 0


def _warm_embed(fn: Any) -> None:
    f = np.ones((3, 4), np.float32)
    one = np.ones(4, np.float32)
    out = np.empty((2, 4), np.float32)
    for it in (np.int32, np.int64):
        ids = np.zeros((1, 2), it)
        none = np.zeros((0, 0), it)
        fn(ids, none, none, f, f, f, one, one, 1e-5, out, np.zeros((0, 4), np.float32))
        fn(ids, ids, ids, f, f, f, one, one, 1e-5, out, np.empty_like(out))


_EMBED_NORM = Jitted(_embed_norm_f32, _warm_embed, helpers=_F32_ROW)


def embed_norm_rows_f32() -> Any:
    """``fn(ids, seg_ids, pos_ids, word, pos, seg, scale, beta, eps, y, total) -> code``
    (``_embed_norm_f32``) for float32 tables, or None without numba."""
    return _EMBED_NORM.get()


def _warm_rms_for(t: Any) -> Any:
    def warm(fn: Any) -> None:
        x = np.zeros((1, 4), t)
        fn(x, np.ones(4, t), 1e-5, np.empty_like(x))

    return warm


def _warm_for(t: Any) -> Any:
    def warm(fn: Any) -> None:
        x = np.zeros((1, 4), t)
        fn(x, np.ones(4, t), np.zeros(4, t), 1e-5, np.empty_like(x))

    return warm


_LN = {
    np.dtype(np.float32): Jitted(_ln_f32, _warm_for(np.float32), helpers=_F32_ROW),
    np.dtype(np.float64): Jitted(
        _ln_f64, _warm_for(np.float64), helpers=(_normalize_row, _ln_f64_row)
    ),
}


_RMS = {
    np.dtype(np.float32): Jitted(_rms_f32, _warm_rms_for(np.float32), helpers=(_row_sums,)),
    np.dtype(np.float64): Jitted(_rms_f64, _warm_rms_for(np.float64)),
}


def rms_norm_rows(dtype: np.dtype) -> Any:
    """``fn(x, scale, eps, y)``: per row ``y = x / sqrt(mean(x^2) + eps) * scale`` (sum of
    squares accumulated in float64 as in ``_ln_f32``; float64 rows in float64), for
    ``dtype`` float32/float64; None otherwise or without numba."""
    j = _RMS.get(np.dtype(dtype))
    return None if j is None else j.get()


def layer_norm_rows(dtype: np.dtype) -> Any:
    """The compiled row normalization for ``dtype`` (float32 or float64), or None (another
    dtype, numba missing or ``$TFRT_PY_JIT=0``). The first call in a process compiles it
    (or loads it from numba's cache)."""
    j = _LN.get(np.dtype(dtype))
    return None if j is None else j.get()
