"""Compiled squared distances between two sets of rows, in NumPy's summation order.

``pairwise_sq_dist_f()`` (asked at load by ``PairwiseSqDist``, the fused nearest-neighbour
Scan of ``kernels/fused/ml.py``) gives ``fn(y, xt, out)``: ``y`` (M, K) and ``xt`` (K, N)
C-contiguous of one float dtype (``xt`` is the other set transposed, made once at load
when it is a constant), ``out`` (M, N); ``out[i, j] = sum_k (xt[k, j] - y[i, k]) ** 2``.

The sum over ``k`` is the one ``np.add.reduce`` computes for a contiguous axis of at most
``MAX_K`` elements (NumPy's pairwise summation: fewer than 8 terms one after another from
0; else eight running sums over every eighth term, combined as ((r0 + r1) + (r2 + r3)) +
((r4 + r5) + (r6 + r7)), then the remaining terms one after another), so the values are
the unfused Scan's bit for bit. The loops run over ``j`` innermost (N distances at once,
vectorized) where the broadcast NumPy path made an (M, N, K) temporary: 1000 queries x 500
rows x 20 features took 2.2 ms against 21 ms. None when numba is unavailable
(``kernels/lib/jit.py``): the caller keeps its NumPy path. Any thread (releases the GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted

__all__ = ["MAX_K", "pairwise_sq_dist_f"]

#: NumPy sums longer axes in halves (recursively); those keep the NumPy path.
MAX_K = 128


def _pairwise_sq_dist(y: Any, xt: Any, out: Any) -> None:  # pragma: no cover - numba only
    """NumPy's order as eight running sums started at 0 (0 + v is v exactly for the
    squares, NaN and inf included): fewer than 8 terms leave them all 0 and the terms are
    added one after another to their +0.0 combination, as NumPy's ``res = 0.; res += a[i]``."""
    m, k = y.shape
    n = xt.shape[1]
    r = np.empty((8, n), y.dtype)
    tail = k - k % 8
    for i in range(m):
        yi = y[i]
        for t in range(8):
            rt = r[t]
            for j in range(n):
                rt[j] = 0.0
        for b in range(0, tail, 8):
            for t in range(8):
                c = yi[b + t]
                xk = xt[b + t]
                rt = r[t]
                for j in range(n):
                    d = xk[j] - c
                    rt[j] += d * d
        oi = out[i]
        for j in range(n):
            s = ((r[0, j] + r[1, j]) + (r[2, j] + r[3, j])) + (
                (r[4, j] + r[5, j]) + (r[6, j] + r[7, j])
            )
            for t in range(tail, k):
                d = xt[t, j] - yi[t]
                s += d * d
            oi[j] = s


def _warm(fn: Any) -> None:
    for t in (np.float32, np.float64):
        fn(np.zeros((1, 9), t), np.zeros((9, 2), t), np.zeros((1, 2), t))


_PAIRWISE = Jitted(_pairwise_sq_dist, _warm)


def pairwise_sq_dist_f() -> Any:
    """The compiled kernel (see the module doc), or None when the NumPy path must run."""
    return _PAIRWISE.get()
