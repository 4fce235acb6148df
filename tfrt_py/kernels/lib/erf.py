"""The error function on NumPy arrays, without SciPy (shared by the elementwise family's
Erf and Gelu and the contrib family's Gelu/BiasGelu).

* ``erf_f32``: float32 (and narrower floats, computed in float32). A single odd/even
  rational approximation on ``[-4, 4]`` (outside it erf is +/-1 in float32), branch-free:
  about 15 vector passes. Max error ~4e-7 relative, a few float32 ulps.
* ``erf_f64``: float64, accurate to 1 ulp. The fdlibm ``s_erf.c`` algorithm (Sun
  Microsystems, 1993; "Permission to use, copy, modify, and distribute this software is
  freely granted, provided that this notice is preserved"), vectorized: elements are
  split by range with index arrays and each range is evaluated on its elements only.
* ``erf``: dispatches on dtype and size (small arrays use ``math.erf`` per element);
  returns the input's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .chunks import by_chunks

__all__ = ["erf", "erf_f32", "erf_f64"]

# float32 rational: erf(x) ~= x * P(x^2) / Q(x^2) on [-4, 4] (highest degree first).
_P32 = tuple(
    np.float32(c)
    for c in (
        -2.72614225801306e-10,
        2.77068142495902e-08,
        -2.10102402082508e-06,
        -5.69250639462346e-05,
        -7.34990630326855e-04,
        -2.95459980854025e-03,
        -1.60960333262415e-02,
    )
)
_Q32 = tuple(
    np.float32(c)
    for c in (
        -1.45660718464996e-05,
        -2.13374055278905e-04,
        -1.68282697438203e-03,
        -7.37332916720468e-03,
        -1.42647390514189e-02,
    )
)


_M4 = np.float32(-4.0)
_P4 = np.float32(4.0)

#: The floor of the squared argument of the float32 erf's and logistic's polynomials
#: (here, ``activations._act_row`` and ``gelu_jit``: one max a value). Their highest terms
#: (-2.7e-10 x^2 in P32, 6.1e-13 x^2 in the logistic's Q) are subnormal for |x| below
#: ~1e-14 without fused multiply-adds (the native tier's generated code contracts its
#: Horner steps into them and needs no floor), and every operation that makes a subnormal
#: costs ~100 cycles on Intel cores: EfficientNet-B0's 1152x7x7 SiLUs, whose inputs are
#: ~1e-12 with random weights, took 270 µs instead of 110. Below the floor (|x| < 1e-10)
#: every term past the constant is under half an ulp of it, so the result is the same, bit
#: for bit, as with the true square.
POLY_Z_FLOOR = 1e-20
_Z_FLOOR = np.float32(POLY_Z_FLOOR)


def _horner(z: np.ndarray, coeffs: tuple[Any, ...]) -> np.ndarray:
    """coeffs[0]*z^n + ... + coeffs[n], evaluated in place in one new array."""
    r = np.asarray(np.multiply(z, coeffs[0]))
    r += coeffs[1]
    for c in coeffs[2:]:
        r *= z
        r += c
    return r


def erf_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf of a float32 array (NaN propagates), into ``out`` when given."""
    xc = np.asarray(np.maximum(x, _M4))
    np.minimum(xc, _P4, out=xc)
    z = np.asarray(np.multiply(xc, xc))
    np.maximum(z, _Z_FLOOR, out=z)  # POLY_Z_FLOOR (NaN kept)
    p = _horner(z, _P32)
    p *= xc
    q = _horner(z, _Q32)
    return np.divide(p, q, out=out)


# fdlibm s_erf.c (double) coefficients, highest degree first; each denominator ends in 1.
_ERX = 8.45062911510467529297e-01
_PP = (
    -2.37630166566501626084e-05,
    -5.77027029648944159157e-03,
    -2.84817495755985104766e-02,
    -3.25042107247001499370e-01,
    1.28379167095512558561e-01,
)
_QQ = (
    -3.96022827877536812320e-06,
    1.32494738004321644526e-04,
    5.08130628187576562776e-03,
    6.50222499887672944485e-02,
    3.97917223959155352819e-01,
    1.0,
)
_PA = (
    -2.16637559486879084300e-03,
    3.54783043256182359371e-02,
    -1.10894694282396677476e-01,
    3.18346619901161753674e-01,
    -3.72207876035701323847e-01,
    4.14856118683748331666e-01,
    -2.36211856075265944077e-03,
)
_QA = (
    1.19844998467991074170e-02,
    1.36370839120290507362e-02,
    1.26171219808761642112e-01,
    7.18286544141962662868e-02,
    5.40397917702171048937e-01,
    1.06420880400844228286e-01,
    1.0,
)
_RA = (
    -9.81432934416914548592e00,
    -8.12874355063065934246e01,
    -1.84605092906711035994e02,
    -1.62396669462573470355e02,
    -6.23753324503260060396e01,
    -1.05586262253232909814e01,
    -6.93858572707181764372e-01,
    -9.86494403484714822705e-03,
)
_SA = (
    -6.04244152148580987438e-02,
    6.57024977031928170135e00,
    1.08635005541779435134e02,
    4.29008140027567833386e02,
    6.45387271733267880336e02,
    4.34565877475229228821e02,
    1.37657754143519042600e02,
    1.96512716674392571292e01,
    1.0,
)
_RB = (
    -4.83519191608651397019e02,
    -1.02509513161107724954e03,
    -6.37566443368389627722e02,
    -1.60636384855821916062e02,
    -1.77579549177547519889e01,
    -7.99283237680523006574e-01,
    -9.86494292470009928597e-03,
)
_SB = (
    -2.24409524465858183362e01,
    4.74528541206955367215e02,
    2.55305040643316442583e03,
    3.19985821950859553908e03,
    1.53672958608443695994e03,
    3.25792512996573918826e02,
    3.03380607434824582924e01,
    1.0,
)
_HI_MASK = np.uint64(0xFFFFFFFF00000000)


def _erfc_tail(a: np.ndarray, r_num: tuple[float, ...], r_den: tuple[float, ...]) -> np.ndarray:
    """erfc(a) * a for a in [1.25, 6): exp(-a^2 - 0.5625 + R(1/a^2)/S(1/a^2))."""
    s = a * a
    np.reciprocal(s, out=s)
    rs = _horner(s, r_num)
    rs /= _horner(s, r_den)
    z = (a.view(np.uint64) & _HI_MASK).view(np.float64)  # a with its low word cleared
    e1 = z * z
    np.negative(e1, out=e1)
    e1 -= 0.5625
    np.exp(e1, out=e1)
    d = z - a
    d *= z + a
    d += rs
    np.exp(d, out=d)
    d *= e1
    return d


def erf_f64(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf of a float64 array to 1 ulp (fdlibm), into ``out`` when given."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    a = np.abs(flat)
    res = np.empty_like(a)
    # |x| < 0.84375: x + x * P(x^2) / Q(x^2)
    idx = np.flatnonzero(a < 0.84375)
    if idx.size:
        v = flat.take(idx)
        z = v * v
        y = _horner(z, _PP)
        y /= _horner(z, _QQ)
        y *= v
        y += v
        res.put(idx, y)
    # 0.84375 <= |x| < 1.25: erx + P(|x| - 1) / Q(|x| - 1)
    idx = np.flatnonzero((a >= 0.84375) & (a < 1.25))
    if idx.size:
        s = a.take(idx)
        s -= 1.0
        y = _horner(s, _PA)
        y /= _horner(s, _QA)
        y += _ERX
        res.put(idx, y)
    # 1.25 <= |x| < 1/0.35 and 1/0.35 <= |x| < 6: 1 - erfc(|x|)
    for lo, hi, num, den in ((1.25, 1 / 0.35, _RA, _SA), (1 / 0.35, 6.0, _RB, _SB)):
        idx = np.flatnonzero((a >= lo) & (a < hi))
        if idx.size:
            v = a.take(idx)
            y = _erfc_tail(v, num, den)
            y /= v
            np.subtract(1.0, y, out=y)
            res.put(idx, y)
    # |x| >= 6 (and inf): 1; NaN: NaN. Signs are restored below for ranges >= 0.84375.
    big = a >= 6.0
    res[big] = 1.0
    nan = np.isnan(a)
    if nan.any():
        res[nan] = np.nan
    np.copysign(res, flat, out=res)
    res = res.reshape(x.shape)
    if out is not None:
        out[...] = res
        return out
    return res


# Below these sizes, math.erf per element (exact, correctly rounded to the dtype) beats
# the vector code's fixed cost of ~25 (float32) / ~60 (float64) NumPy calls.
_SCALAR_MAX_F32 = 64
_SCALAR_MAX_F64 = 1024
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _erf_scalar(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    f = math.erf
    r = np.array([f(v) for v in x.ravel().tolist()], dtype=np.float64).reshape(x.shape)
    if out is not None:
        np.copyto(out, r, casting="unsafe")
        return out
    return r.astype(x.dtype)


def _erf_f32_into(x: np.ndarray, out: np.ndarray) -> None:
    erf_f32(x, out=out)


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf keeping ``x``'s float dtype (float64 exact to 1 ulp, others via float32)."""
    dt = x.dtype
    if dt == _F32:
        if x.size <= _SCALAR_MAX_F32:
            return _erf_scalar(x, out)
        y = by_chunks(_erf_f32_into, x, out)
        return erf_f32(x, out=out) if y is None else y
    if dt == _F64:
        if x.size <= _SCALAR_MAX_F64:
            return _erf_scalar(x, out)
        return erf_f64(x, out=out)
    if x.size <= _SCALAR_MAX_F32:
        return _erf_scalar(x, out)
    r = erf_f32(x.astype(np.float32))
    if out is not None:
        np.copyto(out, r, casting="unsafe")
        return out
    return r.astype(dt)
