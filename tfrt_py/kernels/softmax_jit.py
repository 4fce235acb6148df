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
2.7 µs; here (a classifier's (1024, 4) probabilities) 50 → 9 µs. For many long rows NumPy's
vectorized passes are as fast, so the caller keeps them (``MAX_ELEMENTS``, ``SHORT_ROW``).
None when numba is unavailable (``kernels/jit.py``). Any thread (releases the GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .jit import Jitted
from .sigmoid_jit import EXP_CONSTS

__all__ = ["MAX_ELEMENTS", "SHORT_ROW", "softmax_rows_f32"]

#: Inputs above this many elements with at least 16 rows and rows longer than
#: ``SHORT_ROW`` keep NumPy's passes.
MAX_ELEMENTS = 8192
#: Rows of at most this many elements take the compiled rows at any size: NumPy's per-row
#: reductions cost most there ((4096, 4) 55 -> 34 µs, (1024, 64) 136 -> 105 µs; from
#: (256, 1000) up NumPy's passes are faster).
SHORT_ROW = 64


def _softmax_rows(x: Any, y: Any, c: Any) -> None:  # pragma: no cover - numba only
    """Each row's max and ``x - max`` into a flat scratch array, then exp over all of it in
    one loop (with 2^k as float bits, as in ``sigmoid_jit``: a long loop vectorizes where a
    row of a few classes does not), then each row's sum and the scaled row into ``y``; only
    that last loop writes ``y``, so ``y`` may be ``x``. Scratch: 8 bytes per element, as
    NumPy's temporaries."""
    log2e, ln2hi, ln2lo = c[0], c[1], c[2]
    p0, p1, p2, p3, p4, p5 = c[3], c[4], c[5], c[6], c[7], c[8]
    one, half, lo = c[9], c[10], c[11]
    zero = one - one
    rows, n = x.shape
    size = rows * n
    xf = x.reshape(size)
    yf = y.reshape(size)
    d = np.empty(size, np.float32)
    ki = np.empty(size, np.int32)
    kf = ki.view(np.float32)
    for i in range(rows):
        base = i * n
        m = xf[base]
        for j in range(1, n):
            v = xf[base + j]
            m = v if v > m else m
        for j in range(n):
            d[base + j] = xf[base + j] - m
    for k in range(size):
        dk = d[k]
        dc = lo if not dk >= lo else dk  # NaN -> lo here (a defined int below)
        fk = np.floor(dc * log2e + half)
        r = dc - fk * ln2hi
        r = r - fk * ln2lo
        p = ((((p0 * r + p1) * r + p2) * r + p3) * r + p4) * r + p5
        p = p * (r * r) + r + one
        d[k] = zero if dk < lo else (p if dk == dk else dk)  # NaN stays NaN
        ki[k] = (np.int32(fk) + np.int32(127)) << np.int32(23)
    for k in range(size):
        d[k] = d[k] * kf[k]
    for i in range(rows):
        base = i * n
        s = 0.0
        for j in range(n):
            s += d[base + j]
        inv = np.float32(1.0 / s)
        for j in range(n):
            yf[base + j] = d[base + j] * inv


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
