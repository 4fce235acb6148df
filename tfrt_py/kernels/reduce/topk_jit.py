"""A compiled TopK over the last axis for small ``k``: one pass per row keeping the ``k``
best entries in order (an insertion into a short sorted list, rarely taken after the first
few entries), where NumPy partitions, counts, sorts and gathers in a dozen calls -- a
nearest-neighbour model's 5 nearest of 500 distances for 1000 queries took 9.4 ms that way.

``topk_rows()`` (asked at load) gives ``fn(x, k, largest, values, indices) -> bool``: ``x``
a C-contiguous 2-D float32/float64 array (rows, n), ``values`` (rows, k) of its dtype and
``indices`` (rows, k) int64 filled with each row's ``k`` largest (``largest``) or smallest
entries, best first, ties by ascending index -- the order of a stable sort, as the NumPy
path (``index._topk_sort``). Returns False, leaving the outputs partly written, when a row
holds a NaN: the caller then takes the NumPy path, which orders NaNs as NumPy's sort does.
The work per row is O(n) plus O(k) per insertion, O(n k) at worst (an already sorted row),
hence ``MAX_K``. None when numba is unavailable (``kernels/lib/jit.py``). Any thread (releases
the GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted

__all__ = ["MAX_K", "topk_rows"]

#: Larger ``k`` keeps the NumPy path (a sorted list of ``k`` entries per row).
MAX_K = 32


def _topk_rows(
    x: Any, k: int, largest: bool, values: Any, indices: Any
) -> bool:  # pragma: no cover - numba only
    rows, n = x.shape
    keys = np.empty(k, x.dtype)  # smaller key = better: -v for largest
    idx = np.empty(k, np.int64)
    for i in range(rows):
        xi = x[i]
        filled = 0
        for j in range(n):
            v = xi[j]
            if v != v:
                return False
            key = -v if largest else v
            if filled < k:
                p = filled
                filled += 1
            elif key < keys[k - 1]:
                p = k - 1
            else:
                continue
            while p > 0 and keys[p - 1] > key:  # equal keys stay ahead: ascending index
                keys[p] = keys[p - 1]
                idx[p] = idx[p - 1]
                p -= 1
            keys[p] = key
            idx[p] = j
        for t in range(k):
            indices[i, t] = idx[t]
            values[i, t] = xi[idx[t]]
    return True


def _warm(fn: Any) -> None:
    for t in (np.float32, np.float64):
        fn(np.zeros((1, 3), t), 2, True, np.zeros((1, 2), t), np.zeros((1, 2), np.int64))


_TOPK = Jitted(_topk_rows, _warm)


def topk_rows() -> Any:
    """The compiled kernel (see the module doc), or None when the NumPy path must run."""
    return _TOPK.get()
