"""Scalar float32 math for generated native code, written so LLVM vectorizes the loops
that call it (libm's ``expf``, which numba calls for ``np.exp``, is a call per element).

``expf(x)``: e**x in float32 -- Cody-Waite reduction by ln 2, a degree-7 polynomial,
2**k built from exponent bits in two halves (so results down to the subnormals, and 0
below them, come out right): within 2 ulp of libm's expf; NaN stays NaN, +inf above
88.72, 0 below -103.97. Branch-free (selects only). Stateless; any thread.

``rounded(x)``: x itself, as a fence LLVM's contraction does not cross: in code compiled
with ``fastmath={'contract'}`` (the native tier's modules) ``acc += rounded(v * v)`` rounds the
product before the sum, as onnxruntime's ReduceSumSquare does, where ``acc += v * v`` would
become one fused multiply-add. float32 and float64.

``expf_neg(x)``: the same for x <= 0 or NaN (a softmax's ``x - max``), 0 below -87.34
(where e**x leaves the normal floats: a probability under 1.2e-38), in one 2**k and two
fewer selects: 30% less time per element than ``expf`` (2-core Zen 4, AVX-512), the
same values above -87.34.

``expf_rn(x)``: e**x for a float32 x as libm's correctly rounded ``expf`` gives it (what
onnxruntime's SVM kernels call): evaluated in float64 (reduction by ln 2, a degree-11
polynomial, relative error under 1e-14) and rounded once to float32, so it differs from
the correctly rounded value only where e**x lies within 1e-14 of a float32 rounding
boundary. About twice ``expf``'s cost a vector (half the lanes); vectorizes the same way.
+inf above 88.73, 0 below -103.98, NaN stays NaN.

``fma(a, b, c)``: ``a * b + c`` rounded once (``llvm.fma``), whatever the caller's
``fastmath``. float32 and float64.

``tanhf_mlas(x)``: tanh as onnxruntime's MLAS computes it on x86-64 with FMA
(``MlasComputeTanh``, Eigen's rational approximation: x clamped to [-9, 9], a degree-13
odd numerator over a degree-6 even denominator, each step a fused multiply-add): its values
bit for bit where the division rounds the same, and a vectorized loop where libm's
``tanhf`` is a call per element. NaN stays NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ...kernels.lib.mlas_tanh import DENOMINATOR, LIMIT, NUMERATOR
from .closure_cache import stamp_with_siblings

__all__ = ["expf", "expf_neg", "expf_rn", "fma", "rounded", "tanhf_mlas"]

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_HI = np.float32(88.72284)  # above: inf
_LO = np.float32(-103.97208)  # below: 0 (the smallest subnormal's log is -103.28)
_LO_NORMAL = np.float32(-87.33654)  # the smallest normal float's log


@intrinsic
def _bits_to_f32(typingctx, bits):
    """The float32 whose IEEE bits are the low 32 bits of the integer ``bits``."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if getattr(bits, "bitwidth", 64) > 32:
            v = builder.trunc(v, context.get_value_type(types.int32))
        return builder.bitcast(v, context.get_value_type(types.float32))

    return types.float32(bits), codegen


@intrinsic
def _bits_to_f64(typingctx, bits):
    """The float64 whose IEEE bits are the 64-bit integer ``bits``."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if getattr(bits, "bitwidth", 64) < 64:
            v = builder.sext(v, context.get_value_type(types.int64))
        return builder.bitcast(v, context.get_value_type(types.float64))

    return types.float64(bits), codegen


@intrinsic
def rounded(typingctx, x):
    """``x``, behind ``llvm.arithmetic.fence`` (the module doc)."""
    if x not in (types.float32, types.float64):
        return None

    def codegen(context, builder, sig, args):
        t = context.get_value_type(sig.return_type)
        fn = builder.module.declare_intrinsic("llvm.arithmetic.fence", [t], ir.FunctionType(t, [t]))
        return builder.call(fn, args)

    return x(x), codegen


@njit(nogil=True, cache=True, inline="always")
def _pow2(k):
    """2**k for an integer -126 <= k <= 127."""
    return _bits_to_f32((k + 127) << 23)  # type: ignore[call-arg]


@njit(nogil=True, cache=True, inline="always")
def _poly(r):
    """e**r for |r| <= ln(2)/2: the degree-7 Taylor polynomial, by Horner."""
    p = np.float32(1.0 / 5040.0)
    p = p * r + np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    return p * r + np.float32(1.0)


@njit(nogil=True, cache=True, inline="always")
def expf(x):
    xc = min(max(x, _LO), _HI)
    kf = np.floor(xc * _LOG2E + np.float32(0.5))
    r = xc - kf * _LN2_HI - kf * _LN2_LO
    p = _poly(r)
    k = np.int32(kf)
    k1 = k >> 1
    y = p * _pow2(k1) * _pow2(k - k1)
    y = np.float32(np.inf) if x > _HI else y
    y = np.float32(0.0) if x < _LO else y
    return x if x != x else y


@njit(nogil=True, cache=True, inline="always")
def expf_neg(x):
    xc = max(x, _LO_NORMAL)
    kf = np.floor(xc * _LOG2E + np.float32(0.5))  # -126..0
    r = xc - kf * _LN2_HI - kf * _LN2_LO
    p = _poly(r)
    y = p * _pow2(np.int32(kf))
    y = np.float32(0.0) if x < _LO_NORMAL else y
    return x if x != x else y


_LN2_HI64 = 6.93147180369123816490e-01  # ln 2 in 32 bits, so k * _LN2_HI64 is exact
_LN2_LO64 = 1.90821492927058770002e-10
_LOG2E64 = 1.4426950408889634


@njit(nogil=True, cache=True, inline="always")
def expf_rn(x):
    xd = min(max(np.float64(x), -110.0), 90.0)
    kf = np.floor(xd * _LOG2E64 + 0.5)  # -159..130
    r = (xd - kf * _LN2_HI64) - kf * _LN2_LO64  # |r| <= 0.347
    p = 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    y = np.float32(p * _bits_to_f64((np.int64(kf) + 1023) << 52))  # type: ignore[call-arg]
    return x if x != x else y


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (the module doc)."""
    if not (a == b == c and a in (types.float32, types.float64)):
        return None

    def codegen(context, builder, sig, args):
        t = context.get_value_type(sig.return_type)
        fn = builder.module.declare_intrinsic("llvm.fma", [t], ir.FunctionType(t, [t, t, t]))
        return builder.call(fn, args)

    return a(a, b, c), codegen


_fma: Any = fma  # the intrinsic, typed for mypy's sake

# MLAS's tanh constants, one copy (``kernels/lib/mlas_tanh.py``), as scalars numba folds
_T_HI = LIMIT
_T_LO = -LIMIT
_A13, _A11, _A9, _A7, _A5, _A3, _A1 = NUMERATOR
_B6, _B4, _B2, _B0 = DENOMINATOR


@njit(nogil=True, cache=True, inline="always")
def tanhf_mlas(x):
    v = x if x != x else min(max(x, _T_LO), _T_HI)
    v2 = v * v
    p = _fma(v2, _A13, _A11)
    p = _fma(p, v2, _A9)
    p = _fma(p, v2, _A7)
    p = _fma(p, v2, _A5)
    p = _fma(p, v2, _A3)
    p = _fma(p, v2, _A1)
    q = _fma(v2, _B6, _B4)
    q = _fma(q, v2, _B2)
    q = _fma(q, v2, _B0)
    return (p * v) / q


stamp_with_siblings(globals())
