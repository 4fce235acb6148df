"""A compiled in-place Sigmoid / SiLU for float32 with a vectorizable exp, shared by the
conv epilogues (nn) and the Sigmoid and Swish kernels (elementwise).

``sigmoid_f32()`` (asked at load) gives ``fn(y, silu)`` computing ``y * sigmoid(y)``
(``silu``) or ``sigmoid(y)`` in place over a flat contiguous float32 array, or None when
numba is unavailable (``jit.py``): the callers then run NumPy ufuncs. ``gelu_tanh_f32()``:
the same loop for GELU's tanh form (GPT-2's ``gelu_new``, ``Gelu(approximate="tanh")``).
A compiled loop calling libm's exp per element is 5x slower than NumPy's vectorized exp;
this one builds exp from a polynomial and float bits and runs ~2x faster than the four
NumPy passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .addresses import same_start
from .jit import CONTRACT, Jitted

__all__ = ["EXP_CONSTS", "flat_f32", "gelu_tanh_f32", "in_place", "sigmoid_f32"]


def _sigmoid_flat(y: Any, mode: int, c: Any) -> None:  # pragma: no cover - numba only
    """In place over a flat float32 array: ``mode`` 0 y = sigmoid(y), 1 (SiLU) y = y *
    sigmoid(y), 2 (GELU, tanh form) y = y * sigmoid(2 sqrt(2/pi) (y + 0.044715 y^3)),
    which is 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))) without tanh's cancellation.

    exp(-y) is Cephes' expf written for LLVM's vectorizer: k = round(x log2 e), r = x - k
    ln 2 (in two parts), exp(r) by a degree-6 polynomial, 2^k built as float bits in an
    int32 block (``view``: no libm call per element). Blocks of 1024 stay in L1. Relative
    error ~2e-7 (NumPy's exp: ~1e-7); x past exp's range gives inf / 0 as it should; NaN
    stays NaN. c = [log2e, ln2_hi, ln2_lo, p0..p5, 1, 0.5, lo, hi, inf]."""
    log2e, ln2hi, ln2lo = c[0], c[1], c[2]
    p0, p1, p2, p3, p4, p5 = c[3], c[4], c[5], c[6], c[7], c[8]
    one, half, lo, hi, inf = c[9], c[10], c[11], c[12], c[13]
    g1, g3 = c[14], c[15]  # the GELU argument's -2 sqrt(2/pi) and 0.044715
    n = y.shape[0]
    ki = np.empty(1024, np.int32)
    e = np.empty(1024, y.dtype)
    kf = ki.view(np.float32)
    for s in range(0, n, 1024):
        m = min(1024, n - s)
        ys = y[s:]
        for i in range(m):
            v = ys[i]
            x0 = g1 * (v + g3 * (v * v * v)) if mode == 2 else -v
            x = lo if not x0 >= lo else x0  # NaN -> lo here (a defined int below)
            x = hi if x > hi else x
            fk = np.floor(x * log2e + half)
            r = x - fk * ln2hi
            r = r - fk * ln2lo
            p = ((((p0 * r + p1) * r + p2) * r + p3) * r + p4) * r + p5
            p = p * (r * r) + r + one
            e[i] = inf if x0 > hi else (p if x0 == x0 else x0)  # NaN stays NaN
            ki[i] = (np.int32(fk) + np.int32(127)) << np.int32(23)
        if mode != 0:
            for i in range(m):
                ys[i] = ys[i] / (one + e[i] * kf[i])
        else:
            for i in range(m):
                ys[i] = one / (one + e[i] * kf[i])


#: The float32 exp's constants (see ``_sigmoid_flat``), shared with ``softmax_jit``.
EXP_CONSTS = np.array(
    [1.44269504088896341, 0.693359375, -2.12194440e-4, 1.9875691500e-4, 1.3981999507e-3,
     8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1, 1.0, 0.5, -87.0,
     88.0, np.inf, -2.0 * np.sqrt(2.0 / np.pi), 0.044715],
    np.float32,
)  # fmt: skip


def _warm_sigmoid(fn: Any) -> None:
    fn(np.zeros(4, np.float32), 1, EXP_CONSTS)


_SIGMOID = Jitted(_sigmoid_flat, _warm_sigmoid, fastmath=CONTRACT)


def sigmoid_f32() -> Callable[[np.ndarray, bool], None] | None:
    """``fn(y, silu)``: in place over a flat contiguous float32 ``y``; None without numba."""
    compiled = _SIGMOID.get()
    if compiled is None:
        return None

    def sigmoid(y: np.ndarray, silu: bool) -> None:
        compiled(y, 1 if silu else 0, EXP_CONSTS)

    return sigmoid


def gelu_tanh_f32() -> Callable[[np.ndarray], None] | None:
    """``fn(y)``: GELU's tanh form in place over a flat contiguous float32 ``y`` (as
    ``y * sigmoid(2 sqrt(2/pi) (y + 0.044715 y^3))``, one pass; NumPy's formulation takes
    ten); None without numba."""
    compiled = _SIGMOID.get()
    if compiled is None:
        return None

    def gelu(y: np.ndarray) -> None:
        compiled(y, 2, EXP_CONSTS)

    return gelu


def flat_f32(x: np.ndarray, out: np.ndarray | None) -> bool:
    """float32 and contiguous (``out`` too): what the compiled in-place loops take."""
    return (
        x.dtype == np.float32 and x.flags.c_contiguous and (out is None or out.flags.c_contiguous)
    )


def in_place(fn: Callable[[np.ndarray], None], x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Run an in-place compiled ``fn(flat)`` into ``out`` (or a new array), ``x`` copied
    there first unless ``out`` is ``x``'s own buffer (the planner's in place: a new view of
    it). ``flat_f32(x, out)`` must hold."""
    y = np.copy(x) if out is None else out
    if y is not x and not (np.may_share_memory(x, y) and same_start(y, x)):
        np.copyto(y, x)
    fn(y.reshape(-1))
    return y
