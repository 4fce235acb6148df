"""Dot products of one vector with many rows, for generated native code: the attention
scores of a decode step (``q @ K^T`` with one or a few query rows, ``ops_dec.py``).

``dot_rows_f4(a, ao, b, bo, c, co, n, k, alpha)``: ``c[co + i] = alpha * a[ao:ao + k] .
b[bo + i*k : bo + i*k + k]`` for ``i < n`` (flat float32 arrays, element offsets). BLAS's
gemm at one query row packs the whole of ``b`` first (a copy of the cache per head per
step: 4-5x this loop's time at 513 rows of 64). The sums are reassociated (``fastmath``
``reassoc``: vector lanes, then a horizontal add), so they round differently from a
sequential sum, as BLAS's do; NaN and infinities propagate (no ``nnan``/``ninf``).
Four rows a step share each load of ``a``. Stateless; any thread; the caller checks the
bounds (the generated code's offsets are its own).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["dot_rows_f4"]


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def dot_rows_f4(a, ao, b, bo, c, co, n, k, alpha):  # pragma: no cover - compiled
    s = np.float32(alpha)
    a0 = np.uint64(ao)
    i = 0
    while i + 4 <= n:
        r = np.uint64(bo + i * k)
        kk = np.uint64(k)
        s0 = s1 = s2 = s3 = np.float32(0.0)
        for j in range(k):
            x = a[a0 + np.uint64(j)]
            s0 += x * b[r + np.uint64(j)]
            s1 += x * b[r + kk + np.uint64(j)]
            s2 += x * b[r + np.uint64(2) * kk + np.uint64(j)]
            s3 += x * b[r + np.uint64(3) * kk + np.uint64(j)]
        o = np.uint64(co + i)
        c[o] = s0 * s
        c[o + np.uint64(1)] = s1 * s
        c[o + np.uint64(2)] = s2 * s
        c[o + np.uint64(3)] = s3 * s
        i += 4
    while i < n:
        r = np.uint64(bo + i * k)
        s0 = np.float32(0.0)
        for j in range(k):
            s0 += a[a0 + np.uint64(j)] * b[r + np.uint64(j)]
        c[np.uint64(co + i)] = s0 * s
        i += 1
