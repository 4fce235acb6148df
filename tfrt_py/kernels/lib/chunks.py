"""Elementwise NumPy chains run over cache-sized pieces of their arrays.

A chain of NumPy operations (erf's rational approximation, Gelu around it) makes one pass
over the whole array per operation. Over a 2 MB float32 array each pass goes to memory;
over 32k-element pieces the chain's few temporaries stay in L2, and the same passes ran
3.7x faster (erf on 1024 x 512: 5.3 -> 1.4 ms, 2-core Zen 4). These are the kernels' NumPy
paths: a cold start's stand-ins and hosts without numba.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .addresses import same_start

__all__ = ["CHUNK", "by_chunks"]

#: Elements per piece (128 KB of float32).
CHUNK = 1 << 15


def by_chunks(
    fn: Callable[[np.ndarray, np.ndarray], object], x: np.ndarray, out: np.ndarray | None
) -> np.ndarray | None:
    """``fn(piece_of_x, piece_of_out)`` over flat pieces, for an elementwise ``fn`` (each
    element of its result is a function of the same element of ``x``) that writes the
    piece of ``out`` and returns nothing useful. ``out``: an array of ``x``'s shape and
    dtype, ``x``'s own buffer (in place), or None (a new one). None when it does not apply
    (small, not C-contiguous, ``out`` another dtype or shape or overlapping ``x`` elsewhere):
    the caller runs ``fn`` on the whole arrays. Every piece holds at least ``CHUNK``
    elements, so a ``fn`` that dispatches on size (erf: ``math.erf`` per element on small
    arrays) takes its large-array path on each, as on the whole array."""
    n = x.size
    if n < 2 * CHUNK or not x.flags.c_contiguous:
        return None
    if out is None:
        out = np.empty_like(x)
    elif (
        out.shape != x.shape
        or out.dtype != x.dtype
        or not out.flags.c_contiguous
        or (np.may_share_memory(x, out) and not same_start(out, x))
    ):
        return None
    xf, of = x.reshape(-1), out.reshape(-1)
    i = 0
    while n - i >= 2 * CHUNK:
        fn(xf[i : i + CHUNK], of[i : i + CHUNK])
        i += CHUNK
    fn(xf[i:], of[i:])  # CHUNK to 2 * CHUNK - 1 elements
    return out
