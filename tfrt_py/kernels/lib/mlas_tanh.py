"""tanh as onnxruntime's MLAS computes it (``MlasComputeTanh``: Eigen's rational
approximation, the FMA kernel on x86-64): x clamped to [-LIMIT, LIMIT], ``x p(x^2) /
q(x^2)`` with ``p`` of degree 6 (``NUMERATOR``, highest first) and ``q`` of degree 3
(``DENOMINATOR``), each Horner step one fused multiply-add. The constants here are the
one copy: ``tanh_mlas`` is the NumPy form (the interpreter's SVMs), and the native tier's
``native.kernels.fastmath.tanhf_mlas`` is the compiled one. Stateless; any thread."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DENOMINATOR", "LIMIT", "NUMERATOR", "fma32", "tanh_mlas"]

_F32 = np.dtype(np.float32)
LIMIT = np.float32(9.0)
#: MlasTanhConstants alpha_13 ... alpha_1
NUMERATOR = tuple(np.float32(v) for v in (
    -2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
    5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
    4.89352455891786e-03))  # fmt: skip
#: MlasTanhConstants beta_6 ... beta_0
DENOMINATOR = tuple(np.float32(v) for v in (
    1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
    4.89352518554385e-03))  # fmt: skip


def fma32(a: np.ndarray, b: Any, c: Any) -> np.ndarray:
    """``a * b + c`` of float32 values rounded once to float32, as a fused multiply-add
    (the product is exact in float64; the float64 sum's rounding differs from one rounding
    only where it lands on a float32 tie)."""
    return (a.astype(np.float64) * np.float64(b) + np.float64(c)).astype(_F32)


def tanh_mlas(k: np.ndarray) -> np.ndarray:
    """tanh of float32 ``k`` as MLAS computes it (the module doc). NaN stays NaN."""
    v = np.clip(k, -LIMIT, LIMIT)
    v2 = v * v
    p = fma32(v2, NUMERATOR[0], NUMERATOR[1])
    for a in NUMERATOR[2:]:
        p = fma32(p, v2, a)
    q = fma32(v2, DENOMINATOR[0], DENOMINATOR[1])
    for b in DENOMINATOR[2:]:
        q = fma32(q, v2, b)
    return (p * v) / q
