"""Matrix products on tfrt_py's threads: ``matmul_into`` splits a large (M, K) @ (K, N)
product into row blocks run on the intra-op pool (``concurrency.threads``), one per
thread, each a single-threaded BLAS call (NumPy's BLAS is kept single-threaded:
docs/architecture.md, "Threads"). Products below ``SPLIT_MIN_MACS`` go straight to
``np.matmul``: a split costs a hand-off (~5 µs to an idle helper) and packs the other
operand once more per block. Call-time code: no allocation beyond the output, no locks
but the pool's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..concurrency import native_threads
from ..concurrency.threads import intra_pool
from . import blas
from .jit import Jitted

__all__ = [
    "NATIVE_SPLIT_MIN_MACS",
    "PARTS_PER_THREAD",
    "SPLIT_MIN_MACS",
    "matmul_cols_into",
    "matmul_into",
    "native_blocks",
]

#: Products smaller than this many multiply-adds run whole (~130 µs of single-core BLAS).
#: A split pays for waking a helper (~5 µs when it is idle, tens when it sleeps deeper)
#: and two GIL hand-offs. On the 2-core machine without AVX-512 (2026-11-26, medians of
#: 400 calls): 64x128 @ 128x128 (1M) took 24 µs whole vs 48 split, 256x256 @ 256x64 (4M)
#: 87 vs 84, 32x64 @ 64x3136 (6M) 153 vs 124 by columns, 960x160 @ 160x49 (7.5M) 172 vs
#: 124, 576x96 @ 96x196 (11M) 224 vs 154, 197x192 @ 192x768 (29M) 600 vs 362.
SPLIT_MIN_MACS = 6 << 20
#: Products split on native threads (``concurrency.native_threads``: no GIL, ~4 µs a
#: split) from this many multiply-adds: a 192x32 @ 32x784 product (4.8M, 120 µs whole).
NATIVE_SPLIT_MIN_MACS = 1 << 20
#: Blocks per thread of the budget: one (the caller takes a block a slow helper has not
#: started). Two per thread measured slower on the 2-core machine without AVX-512
#: (2026-11-26, medians of 600 calls, ms): 160x960 @ 960x49 whole 174, 2 row blocks 128,
#: 4 row blocks 133; 440x440 @ 440x49 217 / 144 / 152; 104x104 @ 104x784 180 / 128 / 153:
#: each block packs the other operand again.
PARTS_PER_THREAD = 1
#: A row block has at least this many rows (BLAS micro-kernels want tall panels).
_MIN_ROWS = 32
#: A column block has at least this many columns.
_MIN_COLS = 64


def matmul_into(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray | None = None,
    epilogue: Callable[[np.ndarray], object] | None = None,
) -> np.ndarray:
    """``a @ b`` for 2-D ``a`` (M, K) and ``b`` (K, N), into ``out`` when given (C-contiguous
    rows), split over the intra-op pool when it pays. Same result as ``np.matmul``.
    ``epilogue(rows)``, when given, finishes each block of rows of the result in place
    right after its product, on the thread that computed it (a Linear's bias and
    activation, while the block is in cache); it must be elementwise along the rows."""
    m, k = a.shape
    n = b.shape[1]
    pool = intra_pool()
    t = pool.threads
    macs = m * k * n
    if t > 1 and m >= 2 * _MIN_ROWS and macs >= NATIVE_SPLIT_MIN_MACS:
        if out is None:
            out = np.empty((m, n), np.result_type(a, b))
        if native_blocks(a, b, out, t):
            if epilogue is not None:
                epilogue(out)
            return out
    if t == 1 or m < 2 * _MIN_ROWS or macs < SPLIT_MIN_MACS:
        r = np.matmul(a, b, out=out)
        if epilogue is not None:
            epilogue(r)
        return r
    if out is None:
        out = np.empty((m, n), np.result_type(a, b))
    blocks = min(PARTS_PER_THREAD * t, m // _MIN_ROWS)
    edges = [m * i // blocks for i in range(blocks + 1)]
    mm = np.matmul

    def part(r0: int, r1: int) -> Any:
        if epilogue is None:
            return lambda: mm(a[r0:r1], b, out=out[r0:r1])

        def run() -> None:
            epilogue(mm(a[r0:r1], b, out=out[r0:r1]))

        return run

    pool.run([part(edges[i], edges[i + 1]) for i in range(blocks)])
    return out


def matmul_cols_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[:] = a @ b`` for 2-D ``a`` (M, K), ``b`` (K, L) and a C-contiguous ``out``
    (M, L), split when it pays: into column blocks when ``b`` is wider than ``a`` is tall
    (a convolution's im2col product: few filters, many output pixels; each part reads only
    its columns of ``b``), else into row blocks (``matmul_into``). Same result as
    ``np.matmul``; the blocks are BLAS calls on strided views (no copies), on native
    threads (``native_blocks``) or the Python intra-op pool."""
    m, k = a.shape
    n = b.shape[1]
    pool = intra_pool()
    t = pool.threads
    if m >= n:
        return matmul_into(a, b, out)
    if t > 1 and m * k * n >= NATIVE_SPLIT_MIN_MACS and native_blocks(a, b, out, t, cols=True):
        return out
    if t == 1 or m * k * n < SPLIT_MIN_MACS:
        return np.matmul(a, b, out=out)
    blocks = min(PARTS_PER_THREAD * t, n // _MIN_COLS)
    if blocks < 2:
        return np.matmul(a, b, out=out)
    edges = [n * i // blocks for i in range(blocks + 1)]
    mm = np.matmul

    def part(c0: int, c1: int) -> Any:
        return lambda: mm(a, b[:, c0:c1], out=out[:, c0:c1])

    pool.run([part(edges[i], edges[i + 1]) for i in range(blocks)])
    return out


#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles, and
#: NumPy's BLAS gemm (``blas.register``, its ``prepare``).
numba: Any = None
_sgemm: Any = None
_dgemm: Any = None


def _matmul_blocks(a: Any, b: Any, out: Any, edges: Any, cols: bool) -> None:  # pragma: no cover
    """out = a @ b (C-contiguous 2-D arrays of one dtype) in blocks of rows (``cols``
    False) or columns between consecutive ``edges``, in a ``prange`` loop on native
    threads, each block one call of NumPy's single-threaded BLAS gemm on its part of the
    arrays (leading dimensions: no copies). numba only; ``numba``, ``_sgemm`` and
    ``_dgemm`` are this module's globals once ``Jitted`` prepares it."""
    m, k = a.shape
    n = b.shape[1]
    sz = out.itemsize
    one, zero = out.dtype.type(1), out.dtype.type(0)
    for i in numba.prange(edges.shape[0] - 1):
        e0, e1 = edges[i], edges[i + 1]
        # addresses in uint64 (uint64 + int64 would be a float64 in numba's typing)
        if cols:
            rows, width = m, e1 - e0
            oa, ob, oc = 0, e0 * sz, e0 * sz
        else:
            rows, width = e1 - e0, n
            oa, ob, oc = e0 * k * sz, 0, e0 * n * sz
        pa = a.ctypes.data + np.uint64(oa)
        pb = b.ctypes.data + np.uint64(ob)
        pc = out.ctypes.data + np.uint64(oc)
        if sz == 4:
            _sgemm(101, 111, 111, rows, width, k, one, pa, k, pb, n, zero, pc, n)
        else:
            _dgemm(101, 111, 111, rows, width, k, one, pa, k, pb, n, zero, pc, n)


def _warm_matmul_blocks(fn: Any) -> None:
    for t in (np.float32, np.float64):
        a, b = np.ones((4, 3), t), np.ones((3, 2), t)
        for cols in (False, True):
            fn(a, b, np.empty((4, 2), t), np.array([0, 1, 2], np.int64), cols)


def _prepare_matmul_blocks(module_globals: dict[str, Any]) -> bool:
    return blas.register(module_globals)


_MATMUL_BLOCKS = Jitted(
    _matmul_blocks, _warm_matmul_blocks, parallel=True, prepare=_prepare_matmul_blocks
)


def native_blocks(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, t: int, cols: bool = False
) -> bool:
    """``out[:] = a @ b`` in ``t`` blocks of rows (``cols``: of columns, each at least
    ``_MIN_COLS`` wide; rows: at least ``_MIN_ROWS`` tall) on native threads, when they
    are ready and the operands are C-contiguous float32/float64 arrays of one dtype
    (what the compiled product was built for); False (nothing done) otherwise."""
    if a.dtype != b.dtype or a.dtype != out.dtype or a.dtype not in _FLOATS:
        return False
    if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
        return False
    size = b.shape[1] if cols else a.shape[0]
    most = size // (_MIN_COLS if cols else _MIN_ROWS)
    if most < 2:
        return False
    fn = _MATMUL_BLOCKS.get()
    if fn is None:
        return False
    blocks = min(PARTS_PER_THREAD * native_threads.enter(t), most)
    fn(a, b, out, np.array([size * i // blocks for i in range(blocks + 1)], np.int64), cols)
    return True


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
