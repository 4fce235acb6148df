"""A compiled float32 Softmax over the rows of a small matrix, used by the Softmax kernel
for the inputs NumPy handles worst: few elements (attention scores of one short
sequence, a classifier's logits), where each of NumPy's five passes costs its ~1 µs of
dispatch, and few rows, where the row-wise path runs per-row reductions.

``softmax_rows_f32()`` (asked at load) gives ``fn(x, y)``: ``x`` and ``y`` C-contiguous
2-D float32 arrays of one shape (``y`` may be ``x``); per row ``y = exp(x - max) /
sum(exp(x - max))``, exp being ``sigmoid_jit``'s vectorizable polynomial (relative error
~2e-7; ``x - max`` below -87 gives 0, as float32's exp nearly does). A NaN anywhere in a
row, or a row whose max is +inf or whose entries are all -inf, gives a row of NaN, as the
NumPy formulation. Measured on the anchor machine: (64, 16) 5.8 → 3.0 µs, (4, 1000) 7.3 →
2.7 µs; from (256, 64) up NumPy's vectorized passes are as fast, so the caller keeps
them (``MAX_ELEMENTS``). None when numba is unavailable (``kernels/jit.py``). Any thread
(releases the GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .jit import Jitted
from .sigmoid_jit import EXP_CONSTS

__all__ = ["MAX_ELEMENTS", "softmax_rows_f32"]

#: Inputs above this many elements with at least 16 rows keep NumPy's passes.
MAX_ELEMENTS = 8192


def _softmax_rows(x: Any, y: Any, c: Any) -> None:  # pragma: no cover - numba only
    """Per row: max, exp(x - max) into a scratch row (with 2^k as float bits, as in
    ``sigmoid_jit``), the sum, then the scaled row into ``y``; only the last loop writes
    ``y``, so ``y`` may be ``x`` and the exp loop still vectorizes."""
    log2e, ln2hi, ln2lo = c[0], c[1], c[2]
    p0, p1, p2, p3, p4, p5 = c[3], c[4], c[5], c[6], c[7], c[8]
    one, half, lo = c[9], c[10], c[11]
    zero = one - one
    rows, n = x.shape
    ki = np.empty(n, np.int32)
    kf = ki.view(np.float32)
    e = np.empty(n, np.float32)
    for i in range(rows):
        xi = x[i]
        m = xi[0]
        for j in range(1, n):
            v = xi[j]
            m = v if v > m else m
        for j in range(n):
            d = xi[j] - m
            dc = lo if not d >= lo else d  # NaN -> lo here (a defined int below)
            fk = np.floor(dc * log2e + half)
            r = dc - fk * ln2hi
            r = r - fk * ln2lo
            p = ((((p0 * r + p1) * r + p2) * r + p3) * r + p4) * r + p5
            p = p * (r * r) + r + one
            e[j] = zero if d < lo else (p if d == d else d)  # NaN stays NaN
            ki[j] = (np.int32(fk) + np.int32(127)) << np.int32(23)
        s = 0.0
        for j in range(n):
            v = e[j] * kf[j]
            e[j] = v
            s += v
        inv = np.float32(1.0 / s)
        yi = y[i]
        for j in range(n):
            yi[j] = e[j] * inv


def _warm(fn: Any) -> None:
    x = np.zeros((2, 3), np.float32)
    fn(x, x, EXP_CONSTS)


_SOFTMAX = Jitted(_softmax_rows, _warm)


def softmax_rows_f32() -> Any:
    """``fn(x2d, y2d)`` (see the module doc), or None without numba / with
    ``$TFRT_PY_JIT=0``."""
    compiled = _SOFTMAX.get()
    if compiled is None:
        return None

    def softmax(x: np.ndarray, y: np.ndarray) -> None:
        compiled(x, y, EXP_CONSTS)

    return softmax
