"""numba kernels shared by the classic-ML lowerings: post transforms and small row ops.

Hand-written (no model text, no generated code): generated native modules import them
and call them with flat arrays plus element offsets (the ``loops.Ref`` model), so a
kernel is compiled once per process and type combination, whatever the model. They are
``nogil`` and keep no state; scratch space is passed in by the caller (its arena).

Post transforms follow ``tfrt_py.kernels.ml.common`` (onnxruntime's definitions): codes
``NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT`` = 0..4 (``ml_pack.POST_CODES``). They compute in
float64 and store in the buffer's dtype (within float32 rounding of the NumPy kernels).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .closure_cache import stamp_with_siblings

__all__ = ["argmax", "logistic", "matvec", "normalize_row", "post", "probit"]


_SQRT2 = math.sqrt(2.0)
_A = 0.147
_TWO_PI_A = 2.0 / (math.pi * _A)
_SQRT2_32, _A32, _TWO_PI_A32 = np.float32(_SQRT2), np.float32(_A), np.float32(_TWO_PI_A)
_NAN32 = np.float32(math.nan)


@njit(nogil=True, cache=True)
def logistic(s: float) -> float:
    """The sigmoid, without overflow."""
    e = math.exp(-abs(s))
    if s < 0:
        return e / (e + 1.0)
    return 1.0 / (e + 1.0)


@njit(nogil=True, cache=True)
def probit(p):
    """``sqrt(2) * erfinv(2 p - 1)`` with onnxruntime's Winitzki approximation, in float32
    as onnxruntime and the NumPy kernel compute it (the formula cancels near p = 0.5)."""
    q = np.float32(p)
    x = np.float32(2.0) * q - np.float32(1.0)
    sgn = np.float32(-1.0) if x < 0 else np.float32(1.0)
    t = (np.float32(1.0) - x) * (np.float32(1.0) + x)
    if t > 0:
        lg = np.float32(math.log(t))
    else:
        lg = np.float32(-math.inf if t == 0 else math.nan)
    v = _TWO_PI_A32 + np.float32(0.5) * lg
    inner = v * v - lg / _A32
    r = sgn * np.float32(math.sqrt(-v + np.float32(math.sqrt(inner)))) if inner >= 0 else _NAN32
    return _SQRT2_32 * r


@njit(nogil=True, cache=False, inline="always")
def _max_of(buf, off, n):
    """The largest of ``buf[off:off + n]`` (-inf when ``n`` is 0; NaN entries are passed)."""
    mx = -math.inf
    for j in range(n):
        v = buf[off + j]
        if v > mx:
            mx = v
    return mx


@njit(nogil=True, cache=True)
def post(buf, off, n, code):
    """Apply post transform ``code`` to ``buf[off:off + n]`` in place."""
    if code == 1:
        mx = _max_of(buf, off, n)
        tot = 0.0
        for j in range(n):
            e = math.exp(float(buf[off + j]) - mx)
            buf[off + j] = e
            tot += buf[off + j]
        for j in range(n):
            buf[off + j] = buf[off + j] / tot
    elif code == 2:
        for j in range(n):
            buf[off + j] = logistic(float(buf[off + j]))
    elif code == 3:
        mx = _max_of(buf, off, n)
        tot = 0.0
        for j in range(n):
            v = float(buf[off + j])
            if abs(v) > 1e-7:
                e = math.exp(v - mx)
                tot += e
                buf[off + j] = e
            else:
                buf[off + j] = v * math.exp(min(-mx, 80.0))
        if tot == 0:
            tot = 1.0
        for j in range(n):
            buf[off + j] = buf[off + j] / tot
    elif code == 4:
        for j in range(n):
            buf[off + j] = probit(float(buf[off + j]))


@njit(nogil=True, cache=False, inline="always")
def argmax(buf, off, n):
    """The first index of the largest of ``buf[off:off + n]`` (NaN wins, as NumPy's)."""
    best = 0
    for j in range(1, n):
        v = buf[off + j]
        b = buf[off + best]
        if v > b or (v != v and b == b):
            best = j
    return best


@njit(nogil=True, cache=True)
def matvec(x, xo, k, w, wo, n, y, yo):
    """``y[yo + j] = sum_i x[xo + i] * w[wo + i * n + j]`` (w row-major (k, n)), in y's
    dtype with j innermost."""
    for j in range(n):
        y[yo + j] = 0
    for i in range(k):
        xi = x[xo + i]
        for j in range(n):
            y[yo + j] += xi * w[wo + i * n + j]


@njit(nogil=True, cache=False, inline="always")
def normalize_row(x, xo, n, kind, y, yo):
    """Normalizer: ``y = x / norm(x)`` with norm MAX (0), L1 (1) or L2 (2), computed in
    float64; a zero norm divides by 1."""
    d = 0.0
    if kind == 0:
        d = float(x[xo]) if n else 1.0
        for j in range(1, n):
            v = float(x[xo + j])
            if v > d:
                d = v
    elif kind == 1:
        for j in range(n):
            d += abs(float(x[xo + j]))
    else:
        for j in range(n):
            v = float(x[xo + j])
            d += v * v
        d = math.sqrt(d)
    if d == 0:
        d = 1.0
    for j in range(n):
        y[yo + j] = float(x[xo + j]) / d


stamp_with_siblings(globals())
