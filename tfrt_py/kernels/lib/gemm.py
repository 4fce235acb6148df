"""Matrix products on tfrt_py's threads: ``matmul_into`` splits a large (M, K) @ (K, N)
product into row blocks run on the intra-op pool (``concurrency.threads``), one per
thread, each a single-threaded BLAS call (NumPy's BLAS is kept single-threaded:
docs/architecture.md, "Threads"). Products below ``SPLIT_MIN_MACS`` go straight to
``np.matmul``: a split costs a hand-off (~5 µs to an idle helper) and packs the other
operand once more per block. Call-time code: no allocation beyond the output, no locks
but the pool's."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import compiled_gate, native_threads
from ...concurrency.threads import intra_pool
from . import blas
from .addresses import addresses
from .jit import Jitted, inline

__all__ = [
    "GEMV_SPLIT_MIN_BYTES",
    "NATIVE_SPLIT_MIN_MACS",
    "PARTS_PER_THREAD",
    "SPLIT_MIN_MACS",
    "batch_layout",
    "compile_gemv_dots",
    "gemv_cols",
    "gemv_dots",
    "gemv_dots_pays",
    "gemv_split_pays",
    "matmul_batched_into",
    "matmul_cols_into",
    "matmul_cols_whole",
    "matmul_into",
    "native_blocks",
    "wide_gemv",
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
#: A product of one row by a matrix of at least this many bytes may split by columns on
#: native threads (``wide_gemv``): a classifier's 1x1280 @ 1280x1000 at the end of a CNN
#: reads 5 MB that the convolutions have pushed out of cache. Whether the split pays is
#: measured per shape (``gemv_split_pays``): it costs a parallel region's start, which
#: on the 2-core Zen 3 host (2026-11-29) was more than the split saved at every size up
#: to 9 MB, cold or warm (1x1024 @ 1024x256: 70 µs split, 28 µs on one thread).
GEMV_SPLIT_MIN_BYTES = 1 << 20
#: Blocks per thread of the budget: one (the caller takes a block a slow helper has not
#: started). Two per thread measured slower on the 2-core machine without AVX-512
#: (2026-11-26, medians of 600 calls, ms): 160x960 @ 960x49 whole 174, 2 row blocks 128,
#: 4 row blocks 133; 440x440 @ 440x49 217 / 144 / 152; 104x104 @ 104x784 180 / 128 / 153:
#: each block packs the other operand again.
PARTS_PER_THREAD = 1
#: A row block has at least this many rows (BLAS micro-kernels want tall panels).
_MIN_ROWS = 32
#: A product whose ``b`` has at least this many bytes and more columns than ``a`` has rows
#: splits by columns: blocks of rows each read all of ``b`` (and pack it again), blocks of
#: columns all of ``a``, so the bigger operand is read once. Faster R-CNN's box head,
#: 150x12544 @ 12544x1024 (a weight too big to pack: ``linear_par.PACK_LATER_MAX_BYTES``)
#: on two threads: 14-15 -> 10.2-10.6 ms (Zen 5, onnxruntime 8.0-8.6). Smaller ones keep
#: rows, whose blocks finish their epilogue on their own thread.
COLS_MIN_B_BYTES = 4 << 20
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
    activation, while the block is in cache); it must be elementwise along the rows.
    Its attribute ``fused`` (``linear_par.Fused``), when set, is its compiled
    equivalent: a split on native threads runs it inside each block (the callable
    itself would run over the whole output after them, on one thread)."""
    m, k = a.shape
    n = b.shape[1]
    pool = intra_pool()
    t = pool.threads
    macs = m * k * n
    if t > 1 and wide_gemv(m, k, n, b.itemsize):
        # one row by a big weight matrix: bound by reading the weights, which two threads
        # read faster (each its block of columns)
        if out is None:
            out = np.empty((m, n), np.result_type(a, b))
        if gemv_cols(a, b, out, t):
            if epilogue is not None:
                epilogue(out)
            return out
    if t > 1 and m >= 2 * _MIN_ROWS and macs >= NATIVE_SPLIT_MIN_MACS:
        if out is None:
            out = np.empty((m, n), np.result_type(a, b))
        cols = n > m and n >= 2 * _MIN_COLS and b.nbytes >= COLS_MIN_B_BYTES
        fused = getattr(epilogue, "fused", None)
        if fused is not None and not cols and native_threads.ready():
            blocks = min(PARTS_PER_THREAD * native_threads.enter(t), m // _MIN_ROWS)
            if fused.run(a, b, out, native_threads.edges(m, blocks)):
                return out
        if native_blocks(a, b, out, t, cols):
            if epilogue is not None:
                epilogue(out)
            return out
    if m == 1 and b.nbytes >= GEMV_SPLIT_MIN_BYTES and gemv_dots_pays(k, n, b.itemsize):
        if out is None:
            out = np.empty((m, n), np.result_type(a, b))
        if gemv_dots(a, b, out):
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


def splits(m: int, k: int, n: int, itemsize: int) -> bool:
    """Whether ``matmul_into`` would split a (m, k) @ (k, n) product over threads (this
    process's budget now): a caller with a faster one-thread kernel keeps the rest."""
    t = intra_pool().threads
    if t == 1:
        return False
    big = m >= 2 * _MIN_ROWS and m * k * n >= NATIVE_SPLIT_MIN_MACS
    return big or wide_gemv(m, k, n, itemsize)


def wide_gemv(rows: int, k: int, n: int, itemsize: int) -> bool:
    """Whether a product of ``rows`` by a (k, n) matrix is one worth splitting by columns
    on native threads (``gemv_cols``): one row, a matrix of at least
    ``GEMV_SPLIT_MIN_BYTES`` wide enough for two blocks, on a host where the split was
    measured faster than one thread (``gemv_split_pays``)."""
    if rows != 1 or k * n * itemsize < GEMV_SPLIT_MIN_BYTES or n < 2 * _MIN_COLS:
        return False
    return gemv_split_pays(k, n, itemsize, intra_pool().threads)


#: (k, n, itemsize, threads) -> whether ``gemv_cols`` beat one thread on this host. Written
#: once per shape by whichever thread asks first (a race measures twice, harmlessly).
_GEMV_SPLIT_PAYS: dict[tuple[int, int, int, int], bool] = {}
#: The split must take at most this share of the one-thread time to be chosen.
_GEMV_SPLIT_GAIN = 0.8
_GEMV_PROBE_ROUNDS = 5


def gemv_split_pays(k: int, n: int, itemsize: int, threads: int) -> bool:
    """Whether a one-row product by a (k, n) float matrix runs faster split by columns over
    ``threads`` native threads than as one BLAS call, measured the first time a shape is
    asked (a few calls of each, alternating, on a matrix of that shape: ~1 ms per MB,
    once per process) and remembered. False without threads, without the native kernel
    (not remembered: it may be ready later) or for a dtype it does not take. Which is
    faster depends on the host: a parallel region's start against the bandwidth one
    core gets; no fixed size decides it on every CPU."""
    if threads < 2 or itemsize not in (4, 8):
        return False
    key = (k, n, itemsize, threads)
    got = _GEMV_SPLIT_PAYS.get(key)
    if got is None:
        if _GEMV_COLS.get() is None:
            return False
        got = _GEMV_SPLIT_PAYS[key] = _measure_gemv_split(k, n, itemsize, threads)
    return got


def _measure_gemv_split(k: int, n: int, itemsize: int, threads: int) -> bool:
    dtype = np.float32 if itemsize == 4 else np.float64
    a, w, out = np.ones((1, k), dtype), np.full((k, n), 0.5, dtype), np.empty((1, n), dtype)
    if not gemv_cols(a, w, out, threads):
        return False
    whole, split = _race(lambda: np.matmul(a, w, out=out), lambda: gemv_cols(a, w, out, threads))
    return split <= _GEMV_SPLIT_GAIN * whole


def _race(one: Callable[[], object], other: Callable[[], object]) -> tuple[float, float]:
    """The best seconds of ``one`` and of ``other`` over ``_GEMV_PROBE_ROUNDS`` rounds of
    each, alternating (a first round warms both)."""
    best_one, best_other = math.inf, math.inf
    clock = time.perf_counter
    for _ in range(_GEMV_PROBE_ROUNDS + 1):
        t0 = clock()
        one()
        t1 = clock()
        other()
        t2 = clock()
        best_one, best_other = min(best_one, t1 - t0), min(best_other, t2 - t1)
    return best_one, best_other


def gemv_cols(a: np.ndarray, b: np.ndarray, out: np.ndarray, t: int) -> bool:
    """``out[:] = a @ b`` for one row ``a`` (1, K) and ``b`` (K, N) C-contiguous or the
    transpose of a C-contiguous (N, K) (a Gemm's transB weights), in ``t`` blocks of
    columns on native threads, each one BLAS gemv; False (nothing done) when the threads
    are not there or the arrays are not of that form."""
    trans = _transposed(a, b, out)
    if trans is None:
        return False
    fn = _GEMV_COLS.get()
    if fn is None or b.shape[1] < 2 * _MIN_COLS:
        return False
    blocks = min(PARTS_PER_THREAD * native_threads.enter(t), b.shape[1] // _MIN_COLS)
    fn(
        _read_only(a.reshape(-1)),
        _read_only(b.T if trans else b),
        out.reshape(-1),
        native_threads.edges(b.shape[1], blocks),
        trans,
    )
    return True


def gemv_dots(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """``out[:] = a @ b`` for one row ``a`` (1, K) and ``b`` the transpose of a C-contiguous
    (N, K) (a Gemm's transB weights, as torch.onnx writes a Linear) on the calling thread,
    one dot product a row of the (N, K) matrix; False (nothing done) for another layout or
    without numba. A classifier's head, whose megabytes the call reads from L3 or memory
    (the convs before it evicted them), streams four rows at once: 1280x1000 from a cold
    L2, one Zen 4 thread, 125 -> 95 µs, 2048x1000 261 -> 168 (OpenBLAS's gemv; even where
    the weights are in cache). ``matmul_into`` takes it where ``gemv_dots_pays``; call
    ``compile_gemv_dots`` at load."""
    if _transposed(a, b, out) is not True:
        return False
    fn = _GEMV_DOTS.get()
    if fn is None:
        return False
    fn(_read_only(a.reshape(-1)), _read_only(b.T), out.reshape(-1))
    return True


def compile_gemv_dots(k: int, n: int, itemsize: int) -> None:
    """Compile ``gemv_dots``' kernel and measure whether it pays (``gemv_dots_pays``) now (a
    builder's, at load) where a one-row product by a (k, n) matrix would take it, not in a
    model's first call."""
    if k * n * itemsize >= GEMV_SPLIT_MIN_BYTES and itemsize in (4, 8):
        gemv_dots_pays(k, n, itemsize)


#: (k, n, itemsize) -> whether ``gemv_dots`` beat BLAS's gemv on this host (as
#: ``_GEMV_SPLIT_PAYS``). 1x1280 @ the transpose of 1000x1280, µs, dots / OpenBLAS, warm /
#: from memory: Zen 4 95 / 125 warm, 168 / 261 at 2048x1000; Zen 3 (AVX2) 108 / 92 and
#: 446 / 270 (its gemv reads four rows at once and prefetches).
_GEMV_DOTS_PAYS: dict[tuple[int, int, int], bool] = {}


def gemv_dots_pays(k: int, n: int, itemsize: int) -> bool:
    """Whether ``gemv_dots`` takes a one-row product by the transpose of an (n, k) float
    matrix on this host: measured against BLAS's gemv the first time a shape is asked
    (a few calls of each, alternating, the matrix warm: the order warm and cold agreed on
    both hosts above; once per process) and remembered. False without numba (not
    remembered) or for a dtype it does not take."""
    if itemsize not in (4, 8):
        return False
    key = (k, n, itemsize)
    got = _GEMV_DOTS_PAYS.get(key)
    if got is None:
        fn = _GEMV_DOTS.get()
        if fn is None:
            return False
        dtype = np.float32 if itemsize == 4 else np.float64
        a, w, out = np.ones((1, k), dtype), np.full((n, k), 0.5, dtype), np.empty(n, dtype)
        x, wr = _read_only(a.reshape(-1)), _read_only(w)
        blas, dots = _race(lambda: np.matmul(a, w.T, out=out[None]), lambda: fn(x, wr, out))
        got = _GEMV_DOTS_PAYS[key] = dots <= _GEMV_DOTS_GAIN * blas
    return got


#: ``gemv_dots`` must take at most this share of BLAS's time to be chosen.
_GEMV_DOTS_GAIN = 0.95


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``: numba compiles a kernel once per argument types, and a
    read-only array is another type than a writable one, so ``gemv_cols`` passes its
    operands one way (a model's constant weights are read-only, the probe's are not: the
    first split call with the model's weights compiled in the call)."""
    v = a.view()
    v.setflags(write=False)  # ``v.flags.writeable = False`` leaves ~2.5 bytes a call behind
    return v


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


def matmul_cols_whole(m: int, k: int, n: int) -> bool:
    """Whether a conv's per-image (m, k) @ (k, n) products run as one batched ``np.matmul``
    (one GIL hand-off, not one an image): where ``matmul_cols_into`` would not split them,
    and while a cold start holds the compiled kernels (its warm-up holds the other core
    and the GIL, which a split's parts on the Python pool each wait for; CHANGELOG)."""
    return intra_pool().threads == 1 or m * k * n < NATIVE_SPLIT_MIN_MACS or compiled_gate.held()


#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles, and
#: NumPy's BLAS gemm (``blas.register``, its ``prepare``).
numba: Any = None
_sgemm: Any = None
_dgemm: Any = None
_sgemv: Any = None
_dgemv: Any = None


def _matmul_blocks(
    a: Any, b: Any, out: Any, edges: Any, cols: bool, trans_b: bool
) -> None:  # pragma: no cover
    """out = a @ b (C-contiguous 2-D arrays of one dtype; ``trans_b``: ``b`` holds the
    transposed matrix, (N, K), and the product is a @ b.T) in blocks of rows (``cols``
    False) or columns between consecutive ``edges``, in a ``prange`` loop on native
    threads, each block one call of NumPy's single-threaded BLAS gemm on its part of the
    arrays (leading dimensions: no copies). numba only; ``numba``, ``_sgemm`` and
    ``_dgemm`` are this module's globals once ``Jitted`` prepares it."""
    m, k = a.shape
    n = out.shape[1]
    sz = out.itemsize
    one, zero = out.dtype.type(1), out.dtype.type(0)
    tb = 112 if trans_b else 111  # CblasTrans, CblasNoTrans
    ldb = k if trans_b else n
    for i in numba.prange(edges.shape[0] - 1):
        e0, e1 = edges[i], edges[i + 1]
        # addresses in uint64 (uint64 + int64 would be a float64 in numba's typing)
        if cols:
            rows, width = m, e1 - e0
            oa, ob, oc = 0, e0 * (k if trans_b else 1) * sz, e0 * sz
        else:
            rows, width = e1 - e0, n
            oa, ob, oc = e0 * k * sz, 0, e0 * n * sz
        pa = a.ctypes.data + np.uint64(oa)
        pb = b.ctypes.data + np.uint64(ob)
        pc = out.ctypes.data + np.uint64(oc)
        if sz == 4:
            _sgemm(101, 111, tb, rows, width, k, one, pa, k, pb, ldb, zero, pc, n)
        else:
            _dgemm(101, 111, tb, rows, width, k, one, pa, k, pb, ldb, zero, pc, n)


def _warm_matmul_blocks(fn: Any) -> None:
    t = np.float32
    a, b = np.ones((4, 3), t), np.ones((3, 2), t)
    edges = native_threads.edges(2, 2)  # read-only, as the kernel's
    for cols in (False, True):
        fn(a, b, np.empty((4, 2), t), edges, cols, False)
        fn(a, b.T.copy(), np.empty((4, 2), t), edges, cols, True)


def _prepare_matmul_blocks(module_globals: dict[str, Any]) -> bool:
    return blas.register(module_globals)


@inline
def _dots(x: Any, w: Any, y: Any, r0: int, r1: int) -> None:  # pragma: no cover - numba only
    """``y[r] = w[r] . x`` for rows ``r0 <= r < r1`` of a C-contiguous (N, K) ``w``: each
    row one stream read once, its sum in vector registers (the compiling ``Jitted``'s
    fastmath lets LLVM reassociate it)."""
    zero = y.dtype.type(0)
    r4 = r0 + (r1 - r0) // 4 * 4
    for r in range(r0, r4, 4):  # four rows a pass: four streams, each x[j] loaded once
        a0 = a1 = a2 = a3 = zero
        for j in range(w.shape[1]):
            xj = x[j]
            a0 += w[r, j] * xj
            a1 += w[r + 1, j] * xj
            a2 += w[r + 2, j] * xj
            a3 += w[r + 3, j] * xj
        y[r], y[r + 1], y[r + 2], y[r + 3] = a0, a1, a2, a3
    for r in range(r4, r1):
        acc = zero
        for j in range(w.shape[1]):
            acc += w[r, j] * x[j]
        y[r] = acc


def _gemv_dots(x: Any, w: Any, y: Any) -> None:  # pragma: no cover - numba only
    """``y = w @ x`` for a C-contiguous (N, K) ``w`` (a Gemm's ``transB`` weights) on the
    calling thread (``gemv_dots``)."""
    _dots(x, w, y, 0, w.shape[0])


def _gemv_cols(x: Any, w: Any, y: Any, edges: Any, trans: bool) -> None:  # pragma: no cover
    """y[c0:c1] = x @ w[:, c0:c1] (``trans``: ``w`` holds the (N, K) transpose: y[c0:c1] =
    w[c0:c1] @ x, ``_dots``) for the column blocks between consecutive ``edges``, in a
    ``prange`` loop on native threads, each block one BLAS gemv (row-major) or its rows'
    dot products. numba only."""
    sz = y.itemsize
    one, zero = y.dtype.type(1), y.dtype.type(0)
    if trans:
        n, k = w.shape
    else:
        k, n = w.shape
    for i in numba.prange(edges.shape[0] - 1):
        c0, c1 = edges[i], edges[i + 1]
        if trans:  # rows c0..c1 of the (N, K) matrix times x
            _dots(x, w, y, c0, c1)
        else:  # columns c0..c1 of the (K, N) matrix, transposed, times x
            py = y.ctypes.data + np.uint64(c0 * sz)
            pw = w.ctypes.data + np.uint64(c0 * sz)
            if sz == 4:
                _sgemv(101, 112, k, c1 - c0, one, pw, n, x.ctypes.data, 1, zero, py, 1)
            else:
                _dgemv(101, 112, k, c1 - c0, one, pw, n, x.ctypes.data, 1, zero, py, 1)


def _warm_gemv_cols(fn: Any) -> None:
    t = np.float32
    x, w = _read_only(np.ones(3, t)), np.ones((3, 4), t)  # as gemv_cols passes them
    edges = native_threads.edges(4, 2)  # read-only, as the kernel's
    fn(x, _read_only(w), np.empty(4, t), edges, False)
    fn(x, _read_only(w.T.copy()), np.empty(4, t), edges, True)


def _warm_gemv_dots(fn: Any) -> None:
    for t in (np.float32, np.float64):
        fn(_read_only(np.ones(3, t)), _read_only(np.ones((4, 3), t)), np.empty(4, t))


#: Reassociated sums: ``_dots`` keeps vector partial sums (results differ from BLAS's
#: gemv by rounding only, as BLAS's own kernels differ between ISAs).
_DOTS_MATH = frozenset({"contract", "reassoc"})
_GEMV_COLS = Jitted(_gemv_cols, _warm_gemv_cols, helpers=(_dots,), parallel=True,
                    prepare=_prepare_matmul_blocks, fastmath=_DOTS_MATH)  # fmt: skip
_GEMV_DOTS = Jitted(_gemv_dots, _warm_gemv_dots, helpers=(_dots,), fastmath=_DOTS_MATH)
_MATMUL_BLOCKS = Jitted(_matmul_blocks, _warm_matmul_blocks, parallel=True,
                        prepare=_prepare_matmul_blocks)  # fmt: skip
compile_blocks = _MATMUL_BLOCKS.get  # a builder's: ``native_blocks`` picks it per call


def native_blocks(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, t: int, cols: bool = False
) -> bool:
    """``out[:] = a @ b`` in ``t`` blocks of rows (``cols``: of columns, each at least
    ``_MIN_COLS`` wide; rows: at least ``_MIN_ROWS`` tall) on native threads, when they
    are ready and the operands are C-contiguous float32/float64 arrays of one dtype (``b``
    may be the transpose of one: a Gemm's ``transB`` weights); False (nothing done)
    otherwise."""
    trans_b = _transposed(a, b, out)
    if trans_b is None:
        return False
    size = b.shape[1] if cols else a.shape[0]
    most = size // (_MIN_COLS if cols else _MIN_ROWS)
    if most < 2:
        return False
    fn = _MATMUL_BLOCKS.get()
    if fn is None:
        return False
    blocks = min(PARTS_PER_THREAD * native_threads.enter(t), most)
    fn(a, b.T if trans_b else b, out, native_threads.edges(size, blocks), cols, trans_b)
    return True


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _transposed(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool | None:
    """For the 2-D products on native threads: whether ``b`` is the transpose of a
    C-contiguous array (a Gemm's ``transB`` weights; False: C-contiguous itself), or None
    when the operands are not float32/float64 of one dtype with ``a``, ``out`` and ``b``
    (or its transpose) C-contiguous."""
    if a.dtype != b.dtype or a.dtype != out.dtype or a.dtype not in _FLOATS:
        return None
    if not (a.flags.c_contiguous and out.flags.c_contiguous):
        return None
    if b.flags.c_contiguous:
        return False
    return True if b.T.flags.c_contiguous else None


def _matmul_batched(
    ptr: Any, dims: Any, blocks: Any, trans_b: bool, single: bool, alpha: float
) -> None:  # pragma: no cover
    """out[i, r0:r1] = a[i, r0:r1] @ (b[i].T if ``trans_b`` else b[i]) for the ``blocks``
    rows (i, r0, r1), in a ``prange`` loop on native threads, each one call of NumPy's
    single-threaded BLAS gemm. The matrices are given by address (``ptr``: a, b, out) and
    ``dims`` = [M, K, N, a's inner batch stride, a's row stride, b's inner batch stride,
    b's row stride, out's inner batch stride, out's row stride, matrices per outer batch
    step, a's, b's and out's outer batch strides] in elements (unit inner strides):
    matrix i sits at ``(i // inner) * outer + (i % inner) * inner stride``. ``single``:
    float32 (else float64); ``alpha``: BLAS's factor of the product. numba only (module
    globals as ``_matmul_blocks``)."""
    k, n = dims[1], dims[2]
    sa, lda, sb, ldb, sc, ldc = dims[3], dims[4], dims[5], dims[6], dims[7], dims[8]
    inner, oa, ob, oc = dims[9], dims[10], dims[11], dims[12]
    sz = 4 if single else 8
    tb = 112 if trans_b else 111  # CblasTrans, CblasNoTrans
    for q in numba.prange(blocks.shape[0]):
        i, r0, r1 = blocks[q, 0], blocks[q, 1], blocks[q, 2]
        o, r = i // inner, i % inner
        pa = ptr[0] + np.uint64((o * oa + r * sa + r0 * lda) * sz)
        pb = ptr[1] + np.uint64((o * ob + r * sb) * sz)
        pc = ptr[2] + np.uint64((o * oc + r * sc + r0 * ldc) * sz)
        if single:
            _sgemm(101, 111, tb, r1 - r0, n, k, np.float32(alpha), pa, lda, pb, ldb,
                   np.float32(0), pc, ldc)  # fmt: skip
        else:
            _dgemm(101, 111, tb, r1 - r0, n, k, alpha, pa, lda, pb, ldb, 0.0, pc, ldc)


def _warm_matmul_batched(fn: Any) -> None:
    a, b, c = np.ones((2, 1, 3)), np.ones((2, 3, 3)), np.empty((2, 1, 3))
    ptr = np.array([a.ctypes.data, b.ctypes.data, c.ctypes.data], np.uint64)
    dims = np.array([1, 3, 3, 3, 3, 9, 3, 3, 3, 2, 0, 0, 0], np.int64)
    blocks = np.array([[0, 0, 1], [1, 0, 1]], np.int64)
    for trans in (False, True):
        fn(ptr, dims, blocks, trans, False, 1.0)
    a32, b32, c32 = a.astype(np.float32), b.astype(np.float32), c.astype(np.float32)
    ptr = np.array([a32.ctypes.data, b32.ctypes.data, c32.ctypes.data], np.uint64)
    fn(ptr, dims, blocks, False, True, 1.0)


_MATMUL_BATCHED = Jitted(
    _matmul_batched, _warm_matmul_batched, parallel=True, prepare=_prepare_matmul_blocks
)


def _stack(x: np.ndarray, cols: int, split: int) -> tuple[int, int, int] | None:
    """(outer batch stride, inner batch stride, row stride) in elements of a stack of
    matrices with unit inner stride, rows not overlapping, whose batch dimensions before
    ``split`` collapse into one stride (the outer) and from ``split`` on into another (the
    inner; dims of size 1 ignored); None otherwise."""
    size = x.itemsize
    if x.strides[-1] != size or any(st % size for st in x.strides):
        return None
    row = x.strides[-2] // size
    if row < cols and x.shape[-2] > 1:
        return None
    nb = x.ndim - 2
    strides = []
    for lo, hi in ((0, split), (split, nb)):
        dims = [(x.shape[j], x.strides[j] // size) for j in range(lo, hi) if x.shape[j] > 1]
        for (_, st0), (d1, st1) in itertools.pairwise(dims):
            if st0 != d1 * st1:
                return None
        strides.append(dims[-1][1] if dims else 0)
    return strides[0], strides[1], row


def batch_layout(
    *operands: tuple[np.ndarray, int],
) -> tuple[int, list[tuple[int, int, int]]] | None:
    """(matrices per outer batch step, ``_stack`` of each (stack, row width) operand) for the
    first split of the common batch dimensions at which all of them collapse into an
    outer and an inner stride (attention's V, a (heads, batch) view of a projection, needs
    two); None when none does."""
    nb = operands[0][0].ndim - 2
    for split in range(nb):
        got = [_stack(x, cols, split) for x, cols in operands]
        if all(g is not None for g in got):
            return math.prod(operands[0][0].shape[split:nb]), got  # type: ignore[return-value]
    return None


def matmul_batched_into(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray | None = None,
    trans_b: bool = False,
    alpha: float = 1.0,
) -> np.ndarray:
    """``alpha * a @ b`` (``trans_b``: ``a @ b.swapaxes(-1, -2)``) for stacks of matrices of
    one batch shape (attention's per-head products, often strided views of one
    projection), into ``out`` when given: on the compiled kernel (one BLAS gemm per row
    block; the blocks on native threads when the product is large enough) when every
    operand is a float32/float64 stack of one dtype, each matrix with unit stride along its
    rows or (B) its columns, and batch dimensions that collapse to two strides
    (``batch_layout``; ``alpha`` is BLAS's), else ``np.matmul`` (times ``alpha`` after).
    Same result as ``np.matmul`` to rounding (exactly, for ``alpha`` 1)."""
    if alpha != 1.0:
        y = _matmul_batched_into(a, b, out, trans_b, alpha)
        if y is None:
            y = np.matmul(a, b.swapaxes(-1, -2) if trans_b else b, out=out)
            y *= y.dtype.type(alpha)
        return y
    y = _matmul_batched_into(a, b, out, trans_b, 1.0)
    return np.matmul(a, b.swapaxes(-1, -2) if trans_b else b, out=out) if y is None else y


class _BatchedPlan(NamedTuple):
    """How ``_matmul_batched`` computes one signature of operands (``_plan_batched``)."""

    dims: np.ndarray  # the kernel's dims (never written)
    blocks: np.ndarray  # (matrix, first row, end row) per block (never written)
    trans_b: bool  # B as stored is the transpose of the product's right side
    shape: tuple[int, ...]  # the output's shape
    threads: int  # native threads for the blocks (1: the caller alone)
    single: bool  # float32 (else float64)


def _matmul_batched_into(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None, trans_b: bool, alpha: float
) -> np.ndarray | None:
    """``matmul_batched_into`` on the compiled kernel, or None when it does not apply. The
    plan is made once per signature of the operands (shapes, strides, dtypes, the thread
    budget): a call is one dict lookup, the addresses and the kernel. Whether the kernel
    may run now (numba on, native threads ready, no cold start holding compiled kernels
    back) is asked on every call, never kept in a plan."""
    fn = _MATMUL_BATCHED.get()
    if fn is None:
        return None
    t = intra_pool().threads
    key = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, trans_b, t,
           None if out is None else (out.shape, out.strides, out.dtype))  # fmt: skip
    plan = _BATCHED_PLANS.get(key, _UNPLANNED)
    if plan is _UNPLANNED:
        plan = _plan_batched(a, b, out, trans_b, t)
        if len(_BATCHED_PLANS) >= 1024:  # requests of ever new shapes: start again
            _BATCHED_PLANS.clear()
        _BATCHED_PLANS[key] = plan
    if plan is None:
        return None
    y = np.empty(plan.shape, a.dtype) if out is None else out
    native_threads.enter(plan.threads)
    fn(addresses(a, b, y), plan.dims, plan.blocks, plan.trans_b, plan.single, alpha)
    return y


def _plan_batched(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None, trans_b: bool, t: int
) -> _BatchedPlan | None:
    """The plan of ``a @ (b^T if trans_b else b)`` for stacks of one batch shape and float
    dtype, or None (``np.matmul`` then): decided by the operands alone. A B whose rows are
    strided and columns are not (a transposed view: attention's K^T as one Transpose of the
    heads) is read as the transpose of its swapped view. Products of
    ``NATIVE_SPLIT_MIN_MACS`` and more split into row blocks on ``t`` native threads;
    smaller ones run one block per matrix on the caller (NumPy would loop over strided heads
    at half BLAS's speed)."""
    if (
        a.ndim < 3
        or a.ndim != b.ndim
        or a.shape[:-2] != b.shape[:-2]
        or a.dtype != b.dtype
        or a.dtype not in _FLOATS
    ):
        return None
    bt = b.swapaxes(-1, -2) if trans_b else b
    m, k = a.shape[-2], a.shape[-1]
    n = bt.shape[-1]
    shape = (*a.shape[:-1], n)
    if bt.shape[-2] != k or (out is not None and (out.dtype != a.dtype or out.shape != shape)):
        return None
    if b.strides[-1] != b.itemsize and b.strides[-2] == b.itemsize and b.shape[-1] > 1:
        b, trans_b = b.swapaxes(-1, -2), not trans_b  # the same product, B read transposed
    batch = math.prod(a.shape[:-2])
    threads = t if batch * m * k * n >= NATIVE_SPLIT_MIN_MACS else 1
    if batch < 2 and threads < 2:
        return None  # one matrix on one thread: np.matmul's single gemm
    y = np.empty(shape, a.dtype) if out is None else out
    lay = batch_layout((a, k), (b, k if trans_b else n), (y, n))
    if lay is None:
        return None
    inner, (sa, sb, sc) = lay
    per = max(1, min(-(-2 * threads // batch), m // 16)) if threads > 1 else 1
    rows = [(m * j // per, m * (j + 1) // per) for j in range(per)]
    blocks = np.array([(i, r0, r1) for i in range(batch) for r0, r1 in rows], np.int64)
    dims = np.array(
        [m, k, n, sa[1], sa[2], sb[1], sb[2], sc[1], sc[2], inner, sa[0], sb[0], sc[0]], np.int64
    )
    return _BatchedPlan(dims, blocks, trans_b, shape, threads, a.dtype == np.float32)


_UNPLANNED: Any = object()
#: ``_matmul_batched_into``'s plans by operand signature (a dict read and write are atomic;
#: two threads planning one signature at once make equal plans).
_BATCHED_PLANS: dict[tuple[Any, ...], _BatchedPlan | None] = {}
