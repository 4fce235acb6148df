"""A compiled one-pass GELU (erf form) for float32, used by the Gelu kernel.

``gelu_erf_f32()`` (asked at load) gives a function ``(x, out)`` computing
``x * (erf(x / sqrt 2) + 1) * 0.5`` in one loop with ``erf.erf_f32``'s rational
approximation (clamped to [-4, 4], ``x * P(x^2) / Q(x^2)``), which is branch-free
arithmetic, so LLVM vectorizes it: one pass instead of the ~20 vector passes of the NumPy
formulation. The operations and their order are the NumPy
kernel's, so results agree to a few float32 ulps. Returns None when numba is unavailable
(``kernels/lib/jit.py``): the caller then runs NumPy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .addresses import same_start
from .erf import _P32, _Q32, POLY_Z_FLOOR
from .jit import Jitted, inline

__all__ = ["gelu_erf_f32"]

assert len(_P32) == 7 and len(_Q32) == 5, "gelu_jit's Horner is written for these"
# [1/sqrt2, -4, 4, 1, 0.5, P32..., Q32..., POLY_Z_FLOOR] as float32: typed constants
_CONSTS = np.array(
    [1.0 / np.sqrt(2.0), -4.0, 4.0, 1.0, 0.5, *(float(c) for c in _P32), *(float(c) for c in _Q32),
     POLY_Z_FLOOR],
    np.float32,
)  # fmt: skip


@inline
def _gelu_consts(c: Any) -> Any:  # pragma: no cover - numba only
    """``c``'s 18 constants as a tuple: values in registers, which no store to ``y`` can
    alias (loads from ``c`` inside the loop would keep LLVM from vectorizing)."""
    return (c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11],
            c[12], c[13], c[14], c[15], c[16], c[17])  # fmt: skip


@inline
def _gelu_value(v: Any, k: Any) -> Any:  # pragma: no cover - numba only
    """``v * (erf(v / sqrt 2) + 1) * 0.5`` with the constants ``k`` (``_gelu_consts``). Horner
    written out (7 P and 5 Q coefficients): loops over coefficients would stop LLVM from
    vectorizing."""
    inv, m4, p4, one, half, p0, p1, p2, p3, p4_, p5, p6, q0, q1, q2, q3, q4, floor = k
    t = v * inv
    t = m4 if t < m4 else t
    t = p4 if t > p4 else t
    z = t * t
    z = floor if z < floor else z  # erf.POLY_Z_FLOOR: no subnormal terms
    p = (((((p0 * z + p1) * z + p2) * z + p3) * z + p4_) * z + p5) * z + p6
    q = (((q0 * z + q1) * z + q2) * z + q3) * z + q4
    return ((p * t) / q + one) * v * half


def _gelu_loop(x: Any, y: Any, c: Any) -> None:  # pragma: no cover - numba only
    """y = gelu(x) over flat float32 arrays (x, y distinct: when one buffer has two names
    LLVM's overlap test fails and the loop runs scalar, so the in-place case has its own
    loop, ``_gelu_inplace``)."""
    k = _gelu_consts(c)
    for i in range(x.shape[0]):
        y[i] = _gelu_value(x[i], k)


def _gelu_inplace(y: Any, c: Any) -> None:  # pragma: no cover - numba only
    """``_gelu_loop(y, y, c)``, written for one array (see there)."""
    k = _gelu_consts(c)
    for i in range(y.shape[0]):
        y[i] = _gelu_value(y[i], k)


def _warm(fn: Any) -> None:
    x = np.zeros(4, np.float32)
    fn(x, x, _CONSTS)


def _warm_inplace(fn: Any) -> None:
    fn(np.zeros(4, np.float32), _CONSTS)


# (no fast-math: the compiled pass equals the NumPy formulation bit for bit)
_GELU = Jitted(_gelu_loop, _warm, helpers=(_gelu_consts, _gelu_value))
_GELU_INPLACE = Jitted(_gelu_inplace, _warm_inplace, helpers=(_gelu_consts, _gelu_value))


def gelu_erf_f32() -> Callable[[np.ndarray, np.ndarray | None], np.ndarray | None] | None:
    """The compiled erf GELU for float32, or None when numba is unavailable (asked once, at
    load). The function takes ``(x, out)`` (``out`` may be ``x``; None: a new array) and
    returns the result, or None when an array is not contiguous (then NumPy runs)."""
    two, one = _GELU.get(), _GELU_INPLACE.get()
    if two is None or one is None:
        return None

    def gelu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
        if not x.flags.c_contiguous or (out is not None and not out.flags.c_contiguous):
            return None
        if out is not None and np.may_share_memory(x, out):
            # In place: the planner's out is a new view of x's buffer, not x itself. Two
            # names for one buffer would make LLVM's overlap test send the loop scalar.
            if out.shape != x.shape or not same_start(out, x):
                return None  # a partial overlap: NumPy's ufuncs handle it
            one(out.reshape(-1), _CONSTS)
            return out
        y = np.empty_like(x) if out is None else out
        two(x.reshape(-1), y.reshape(-1), _CONSTS)
        return y

    return gelu
