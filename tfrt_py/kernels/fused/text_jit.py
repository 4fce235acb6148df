"""A compiled one-row pass for ``TextVectorize``'s sparse head (``text._Sparse.one_row``
and ``text._SoftmaxRow``): from one text's counted columns to its scores, and under a
SOFTMAX classifier on to its probabilities and label, in one call where the Python form
takes a dict of counts, four list comprehensions and two arrays (TF-IDF + logistic
regression on a 3-24 word text: 18.5 µs a call, most of it those).

``row_pass()`` gives ``fn(cols, col_scale, w_t, meta, b, out) -> int``:

* ``cols`` int64: the row's columns, one per counted token (repeats counted);
* ``col_scale`` float64 (width,): each column's value per count; ``w_t`` float64
  (width, outputs): the coefficients, times ``col_scale`` where ``meta[0]`` is 0;
* ``meta`` int64: [0] ``distinct`` (each column once, its value ``count * scale``, or
  ``scale`` where [1] ``presence``; else the tokens' ``w_t`` rows summed, which is the same
  for counts), [2] the norm (0 none, 1 L1, 2 L2; a zero norm divides by 1), [3] 1 for a
  softmax head;
* ``out`` float64 (outputs,): the scores before the intercepts; with the softmax head
  the probabilities of ``scores + b``, and the return value the index of the first
  highest score (-1 otherwise).

Sums in float64, as the Python form's floats (within float32 rounding of the unfused
nodes). None without numba (``lib/jit.py``). Any thread (no GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted

__all__ = ["row_pass"]


def _row(cols: Any, col_scale: Any, w_t: Any, meta: Any, b: Any, out: Any
         ) -> int:  # fmt: skip  # pragma: no cover - numba only
    n_out = out.shape[0]
    for j in range(n_out):
        out[j] = 0.0
    n = cols.shape[0]
    d = 0.0
    if meta[0] != 0:  # each column once: its count, value, share of the norm
        s = np.sort(cols)
        i = 0
        while i < n:
            c = s[i]
            k = i
            while k < n and s[k] == c:
                k += 1
            v = col_scale[c] if meta[1] != 0 else (k - i) * col_scale[c]
            d += abs(v) if meta[2] == 1 else v * v
            for j in range(n_out):
                out[j] += v * w_t[c, j]
            i = k
        if meta[2] == 2:
            d = np.sqrt(d)
    else:  # counts: the (scaled) coefficients of each token, repeats and all
        for i in range(n):
            c = cols[i]
            if meta[2] == 1:
                d += abs(col_scale[c])
            for j in range(n_out):
                out[j] += w_t[c, j]
    if meta[2] != 0 and d != 0.0:
        for j in range(n_out):
            out[j] /= d
    if meta[3] == 0:
        return -1
    best = 0
    for j in range(n_out):
        out[j] += b[j]
        if out[j] > out[best]:
            best = j
    top = out[best]
    total = 0.0
    for j in range(n_out):
        out[j] = np.exp(out[j] - top)
        total += out[j]
    for j in range(n_out):
        out[j] /= total
    return best


def _warm(fn: Any) -> None:
    w = np.ones((2, 2))
    for distinct in (0, 1):
        meta = np.array([distinct, 0, 2, 1], np.int64)
        fn(np.array([0, 1, 1], np.int64), np.ones(2), w, meta, np.zeros(2), np.empty(2))


_ROW = Jitted(_row, _warm)


def row_pass() -> Any:
    """The compiled pass, or None (numba missing, ``$TFRT_PY_JIT=0``, or held back)."""
    return _ROW.get()
