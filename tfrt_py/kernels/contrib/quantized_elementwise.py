"""Compiled paths of the elementwise QOperator ops (``quantized.py``): QLinearAdd and
QLinearMul in one pass over their operands, the 256-entry tables of QLinearSigmoid /
QLinearLeakyRelu / QTable looked up without widening the codes to indices (64 codes an
instruction pair with AVX-512 VBMI: ``lib/qlookup_ir``), and
QLinearGlobalAveragePool's sums and requantize in one pass (channels-last: int32 partial
sums over runs of several pixels' channel vectors, the pixels split over the threads).

``compiled_binary`` takes operands that broadcast to the output as (rows, last axis) views
without copies: equal shapes (one flat run, in blocks on the threads), a per-channel
operand of a channels-last tensor (a squeeze-excitation scale, (1, 1, 1, C) against (1, H,
W, C): its term per channel computed once a task and tiled over runs of several rows,
``_qbinary_runs``; a batch's, (N, 1, 1, C), image by image), a scalar. Its float32 steps
are the NumPy path's, in its order: add ``(a - za) * ra + (b - zb) * rb + zc``, mul
``(a - za) * (b - zb) * r + zc`` (a product's two factors in either order: the same
float), then saturated and rounded half to even. Either returns None where numba is off or
the operands do not fit (the caller's NumPy path runs). Blocks on native threads; any
thread.

Parallel loops here allocate nothing outside their ``prange`` (an array made there is a
parallel loop of its own, and ``native_threads.enter`` sets numba's chunk size to 1: one
task an element)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..lib import qlookup_ir
from ..lib.jit import Jitted

__all__ = ["channel_means", "compiled_binary", "compiled_lookup"]

numba: Any = None  # set by Jitted(parallel=True) before the loops below compile
qlookup: Any = None  # qlookup_ir's ExternalFunction, set by _prepare_lookup
_F32 = np.float32
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))
#: elements per parallel block
_BLOCK = 16384


def _rows(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``x`` broadcast to ``shape`` as a read-only (rows, last axis) view, None if that
    needs a copy (the leading axes' strides do not merge). Built from the strides, not by
    setting ``shape`` (deprecated from NumPy 2.5; ``reshape(copy=False)`` needs 2.1)."""
    v = np.broadcast_to(x, shape)
    lead = [(n, s) for n, s in zip(v.shape[:-1], v.strides[:-1], strict=True) if n != 1]
    for (_, outer), (n, inner) in itertools.pairwise(lead):
        if outer != n * inner:
            return None
    stride = lead[-1][1] if lead else 0
    rows = int(np.prod(shape[:-1]))
    return as_strided(v, (rows, shape[-1]), (stride, v.strides[-1]), writeable=False)


def compiled_binary(add: bool, a: np.ndarray, b: np.ndarray, params: np.ndarray,
                    dt: np.dtype) -> np.ndarray | None:  # fmt: skip
    """QLinearAdd (``add``) or QLinearMul of 8-bit ``a`` and ``b`` into ``dt``; ``params``
    float32 [za, zb, r0, r1, zc, lo, hi] (add: r0 = sa/sc, r1 = sb/sc; mul: r0 = sa*sb/sc);
    None as the module doc says."""
    if a.dtype not in _EIGHT_BIT or b.dtype not in _EIGHT_BIT:
        return None
    fn = _BINARY.get()
    if fn is None:
        return None
    if a.shape == b.shape and a.ndim:
        y = np.empty(a.shape, dt)
        if y.size:  # one flat run each: blocks of it on the threads
            native_threads.enter_for(y.size, intra_pool().threads)
            flat = (1, y.size)
            fn(add, np.ascontiguousarray(a).reshape(flat), np.ascontiguousarray(b).reshape(flat),
               params, y.reshape(flat))  # fmt: skip
        return y
    first = _per_channel(a, b)
    if first is not None and (runs := _BINARY_RUNS.get()) is not None:
        full, row = (b, a) if first else (a, b)
        y = np.empty(full.shape, dt)
        if y.size:
            native_threads.enter_for(y.size, intra_pool().threads)
            runs(not add, first, full.reshape(-1), row.reshape(-1), params, y.reshape(-1))
        return y
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        return None
    if not shape:
        return None
    a2, b2 = _rows(a, shape), _rows(b, shape)
    if a2 is None or b2 is None:
        return _per_image(fn, add, a, b, params, dt, shape)
    y = np.empty(shape, dt)
    if y.size:
        native_threads.enter_for(y.size, intra_pool().threads)
        fn(add, a2, b2, params, y.reshape(a2.shape))
    return y


def _per_channel(a: np.ndarray, b: np.ndarray) -> bool | None:
    """True where ``a`` is one row over the last axis (a squeeze-excitation scale: (1, 1,
    1, C)) against contiguous ``b`` of that last axis and at least its rank, False for the
    other way round, None else: the operands ``_qbinary_runs`` takes."""
    for first, (row, full) in ((True, (a, b)), (False, (b, a))):
        if (row.ndim and full.ndim >= row.ndim and row.size == row.shape[-1] == full.shape[-1]
                and row.size > 1 and full.flags.c_contiguous):  # fmt: skip
            return first
    return None


def _per_image(fn: Any, add: bool, a: np.ndarray, b: np.ndarray, params: np.ndarray,
               dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:  # fmt: skip
    """``compiled_binary`` image by image (the first axis), where each image's operands are
    (rows, last axis) views: a batch's squeeze-excitation scales, (N, 1, 1, C) against (N,
    H, W, C). None where an image's operands are not."""
    if len(shape) < 3:
        return None
    ab, bb = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    parts = [(_rows(ab[i], shape[1:]), _rows(bb[i], shape[1:])) for i in range(shape[0])]
    if any(x is None or z is None for x, z in parts):
        return None
    y = np.empty(shape, dt)
    if y.size:
        native_threads.enter_for(y[0].size, intra_pool().threads)
        for i, (x, z) in enumerate(parts):
            fn(add, x, z, params, y[i].reshape(x.shape))  # type: ignore[union-attr]
    return y


def compiled_lookup(x: np.ndarray, table: np.ndarray) -> np.ndarray | None:
    """``table[x]`` for 8-bit ``x`` (the table indexed by its bytes), or None."""
    fn = _LOOKUP_VBMI.get() or _LOOKUP.get()
    if fn is None or x.dtype not in _EIGHT_BIT or x.size == 0:
        return None
    y = np.empty(x.shape, table.dtype)
    native_threads.enter_for(x.size, intra_pool().threads)
    fn(np.ascontiguousarray(x).reshape(-1).view(np.uint8), table, y.reshape(-1))
    return y


def channel_means(x: np.ndarray, last: bool, zx: int, scale: float, zy: float,
                  dt: np.dtype) -> np.ndarray | None:  # fmt: skip
    """QLinearGlobalAveragePool's result in one compiled pass: per image and channel of
    8-bit ``x`` (NCHW..., or N...C when ``last``), ``saturate(rint(float32(sum - zx * P) *
    float32(scale)) + float32(zy))`` in ``dt`` over its P pixels (the int64 sums exact,
    then ``lib.quant.requantize``'s float32 steps), shaped as ``x.sum(axes,
    keepdims=True)``; None where numba is off or ``x`` is empty."""
    fn, fn_last = _MEANS.get(), _MEANS_LAST.get()
    if fn is None or fn_last is None or x.dtype not in _EIGHT_BIT or x.ndim < 3 or x.size == 0:
        return None
    n = x.shape[0]
    c = x.shape[-1] if last else x.shape[1]
    xs = np.ascontiguousarray(x).reshape((n, -1, c) if last else (n, c, -1))
    keep = [1] * x.ndim
    keep[0] = n
    keep[-1 if last else 1] = c
    y = np.empty(keep, dt)
    info = np.iinfo(dt)
    native_threads.enter_for(x.size, intra_pool().threads)
    args = (np.int64(zx), _F32(scale), _F32(zy), _F32(info.min), _F32(info.max), y.reshape(n, c))
    if last:
        parts = max(1, min(intra_pool().threads, xs.shape[1] * c // 65536))
        fn_last(xs.reshape(n, -1), c, *args, np.zeros((n * parts, c), np.int64))
    else:
        fn(xs, *args)
    return y


def _means_last(x, c_, zx, scale, zy, lo, hi, y, sums):  # pragma: no cover - numba only
    # x (N, P * C) channels-last images: per image, ``parts`` runs of pixels on the threads;
    # each sums k pixels' channel vectors as one run of k * C codes (a loop long enough to
    # vectorize), in int32 partial sums flushed every 8192 runs (8192 * 255 fits), into
    # its row of ``sums`` (N * parts, C) int64 zeros (the caller's: an array made here,
    # outside the prange, would be a parallel loop of its own)
    n_ = x.shape[0]
    parts = sums.shape[0] // n_
    p_ = x.shape[1] // c_
    k = max(1, 256 // c_)
    run = k * c_
    steps = p_ // k
    per = (steps + parts - 1) // parts
    for task in numba.prange(n_ * parts):
        n = task // parts
        q = task - n * parts
        flat = x[n]
        acc = np.zeros(run, np.int32)
        s0, s1 = q * per, min(steps, q * per + per)
        for f0 in range(s0, s1, 8192):
            for s in range(f0, min(s1, f0 + 8192)):
                base = np.uint64(s * run)
                for j in range(run):
                    acc[np.uint64(j)] += np.int32(flat[base + np.uint64(j)])
            for kk in range(k):
                for c in range(c_):
                    sums[task, c] += acc[kk * c_ + c]
                    acc[kk * c_ + c] = 0
        if q == parts - 1:  # the pixels after the whole runs
            for i in range(steps * run, p_ * c_):
                sums[task, i % c_] += np.int64(flat[i])
    off = zx * p_
    for n in range(n_):
        for c in range(c_):
            total = np.int64(0)
            for q in range(parts):
                total += sums[n * parts + q, c]
            v = np.rint(np.float32(total - off) * scale) + zy
            y[n, c] = min(max(v, lo), hi)


def _means(x, zx, scale, zy, lo, hi, y):  # pragma: no cover - numba only
    n_, c_ = y.shape
    p_ = x.shape[2]
    off = zx * p_
    # (N, C, P): one contiguous run per channel, channels in blocks of ~64K codes
    per = max(1, 65536 // max(p_, 1))
    for blk in numba.prange((n_ * c_ + per - 1) // per):
        for nc in range(blk * per, min(n_ * c_, blk * per + per)):
            n = nc // c_
            c = nc - n * c_
            row = x[n, c]
            total = np.int64(0)
            for p in range(p_):
                total += np.int64(row[np.uint64(p)])
            v = np.rint(np.float32(total - off) * scale) + zy
            y[n, c] = min(max(v, lo), hi)


def _warm_means_for(last: bool) -> Any:
    def warm(fn: Any) -> None:
        args = (np.int64(0), _F32(1), _F32(1), _F32(0), _F32(255))
        for dt in _EIGHT_BIT:
            for ydt in _EIGHT_BIT:
                if last:
                    fn(np.ones((1, 6), dt), 3, *args, np.empty((1, 3), ydt),
                       np.zeros((2, 3), np.int64))  # fmt: skip
                else:
                    fn(np.ones((1, 2, 3), dt), *args, np.empty((1, 2), ydt))

    return warm


def _qbinary(add, a, b, params, y):  # pragma: no cover - numba only
    # (rows, cols) views; blocks of ~16K elements: several short rows, or a piece of a long one
    rows, cols = y.shape
    za, zb, r0, r1, zc, lo, hi = (params[0], params[1], params[2], params[3], params[4],
                                  params[5], params[6])  # fmt: skip
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    per = max(1, 16384 // max(cols, 1))
    pieces = max(1, cols // 16384)  # a long row's pieces
    for blk in numba.prange(((rows + per - 1) // per) * pieces):
        rb, piece = blk // pieces, blk % pieces
        j0 = piece * cols // pieces
        j1 = (piece + 1) * cols // pieces
        for r in range(rb * per, min(rows, rb * per + per)):
            ar, br, yr = a[r], b[r], y[r]
            if add:  # unsigned indices: the loops vectorize
                for j in range(j0, j1):
                    u = np.uint64(j)
                    v = (np.float32(ar[u]) - za) * r0 + (np.float32(br[u]) - zb) * r1
                    v = min(max(v + zc, lo), hi)
                    yr[u] = (v + magic) - magic
            else:
                for j in range(j0, j1):
                    u = np.uint64(j)
                    v = (np.float32(ar[u]) - za) * (np.float32(br[u]) - zb) * r0
                    v = min(max(v + zc, lo), hi)
                    yr[u] = (v + magic) - magic


def _qbinary_runs(mul, first, x, row, params, y):  # pragma: no cover - numba only
    # x, y flat (rows of C = row's length); row the per-channel operand (the first when
    # ``first``): per task (whole rows on the threads), its term per column tiled over k
    # rows (a run of >= 256 codes: a loop long enough to vectorize), then the task's rows k
    # at a time: mul ((x - zx) * term) * r0 with term (row - zr), add (x - zx) * rx + term
    # with term (row - zr) * rr -- _qbinary's steps, each product's factors in either order
    cols = row.shape[0]
    rows = x.shape[0] // cols
    za, zb, r0, r1, zc, lo, hi = (params[0], params[1], params[2], params[3], params[4],
                                  params[5], params[6])  # fmt: skip
    zr, rr, zx, rx = (za, r0, zb, r1) if first else (zb, r1, za, r0)
    if mul:
        rx = r0
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    k = max(1, 256 // cols)
    run = k * cols
    per = max(1, 4096 // run) * k  # rows per task: whole runs
    for t in numba.prange((rows + per - 1) // per):
        term = np.empty(run, np.float32)
        for kk in range(k):
            for c in range(cols):
                v = np.float32(row[c]) - zr
                term[kk * cols + c] = v if mul else v * rr
        t1 = min(rows, t * per + per)
        for g in range(t * per, t1, k):
            at = np.uint64(g * cols)
            m = min(k, t1 - g) * cols
            if mul:
                for j in range(m):
                    u = np.uint64(j)
                    v = ((np.float32(x[at + u]) - zx) * term[u]) * rx
                    v = min(max(v + zc, lo), hi)
                    y[at + u] = np.int32((v + magic) - magic)
            else:
                for j in range(m):
                    u = np.uint64(j)
                    v = (np.float32(x[at + u]) - zx) * rx + term[u]
                    v = min(max(v + zc, lo), hi)
                    y[at + u] = np.int32((v + magic) - magic)


def _qlookup(x, table, y):  # pragma: no cover - numba only
    n = x.shape[0]
    for blk in numba.prange((n + 16383) // 16384):
        for i in range(blk * 16384, min(n, blk * 16384 + 16384)):
            u = np.uint64(i)
            y[u] = table[x[u]]


def _qlookup_vbmi(x, table, y):  # pragma: no cover - numba only
    # _qlookup's blocks, each by qlookup_ir's kernel
    n = x.shape[0]
    for blk in numba.prange((n + 65535) // 65536):
        at = blk * 65536
        qlookup(x.ctypes.data + at, table.ctypes.data, y.ctypes.data + at, min(n - at, 65536))


def _prepare_lookup(module_globals: dict[str, Any]) -> bool:
    module_globals["qlookup"] = fn = qlookup_ir.kernel()
    return fn is not None


def _warm_binary(fn: Any) -> None:
    p = np.ones(7, _F32)
    for dt in _EIGHT_BIT:
        x = np.ones((2, 3), dt)
        row = np.broadcast_to(np.ones((1, 3), dt), (2, 3))
        for add in (True, False):
            fn(add, x, x, p, np.empty((2, 3), dt))
            fn(add, x, row, p, np.empty((2, 3), dt))
            fn(add, row, x, p, np.empty((2, 3), dt))


def _warm_runs(fn: Any) -> None:
    p = np.ones(7, _F32)
    for dt in _EIGHT_BIT:
        for mul in (True, False):
            for first in (True, False):
                fn(mul, first, np.ones(6, dt), np.ones(3, dt), p, np.empty(6, dt))


def _warm_lookup(fn: Any) -> None:
    for dt in _EIGHT_BIT:
        fn(np.zeros(3, np.uint8), np.zeros(256, dt), np.empty(3, dt))


_BINARY = Jitted(_qbinary, _warm_binary, parallel=True)
_BINARY_RUNS = Jitted(_qbinary_runs, _warm_runs, parallel=True)
_LOOKUP = Jitted(_qlookup, _warm_lookup, parallel=True)
_MEANS = Jitted(_means, _warm_means_for(False), parallel=True)
_MEANS_LAST = Jitted(_means_last, _warm_means_for(True), parallel=True)
_LOOKUP_VBMI = Jitted(_qlookup_vbmi, _warm_lookup, parallel=True, prepare=_prepare_lookup)
