"""Matrix products on tfrt_py's threads: ``matmul_into`` splits a large (M, K) @ (K, N)
product into row blocks run on the intra-op pool (``concurrency.threads``), each a
single-threaded BLAS call (NumPy's BLAS is kept single-threaded: docs/architecture.md,
"Threads"). Small products go straight to ``np.matmul``: a split costs tens of µs of
hand-off. Call-time code: no allocation beyond the output, no locks but the pool's."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..concurrency.threads import intra_pool

__all__ = ["SPLIT_MIN_MACS", "matmul_into"]

#: Products smaller than this many multiply-adds run whole (~150 µs of single-core BLAS).
#: A split pays for waking a helper and two GIL hand-offs, tens of µs each on a VM: on the
#: 2-core reference machine 64x256 @ 256x256 (4M) took 85 µs split vs 43 µs whole, 256^3
#: (16M) broke even, 197x192 @ 192x768 (29M) gained 15% and 512x1024 @ 1024x1024 1.6x.
SPLIT_MIN_MACS = 1 << 24
#: A row block has at least this many rows (BLAS micro-kernels want tall panels).
_MIN_ROWS = 32


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` for 2-D ``a`` (M, K) and ``b`` (K, N), into ``out`` when given (C-contiguous
    rows), split over the intra-op pool when it pays. Same result as ``np.matmul``."""
    m, k = a.shape
    n = b.shape[1]
    pool = intra_pool()
    t = pool.threads
    if t == 1 or m < 2 * _MIN_ROWS or m * k * n < SPLIT_MIN_MACS:
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty((m, n), np.result_type(a, b))
    blocks = min(2 * t, m // _MIN_ROWS)
    edges = [m * i // blocks for i in range(blocks + 1)]
    mm = np.matmul

    def part(r0: int, r1: int) -> Any:
        return lambda: mm(a[r0:r1], b, out=out[r0:r1])

    pool.run([part(edges[i], edges[i + 1]) for i in range(blocks)])
    return out
