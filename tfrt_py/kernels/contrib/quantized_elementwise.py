"""Compiled paths of the elementwise QOperator ops (``quantized.py``): QLinearAdd and
QLinearMul in one pass over their operands, the 256-entry tables of QLinearSigmoid /
QLinearLeakyRelu looked up without widening the codes to indices, and
QLinearGlobalAveragePool's sums and requantize in one pass (int32 partial sums over a
pixel's channel vector).

``compiled_binary`` takes operands that broadcast to the output as (rows, last axis) views
without copies: equal shapes, a per-channel operand of a channels-last tensor (a
squeeze-excitation scale, (1, 1, 1, C) against (1, H, W, C); a batch's, (N, 1, 1, C),
image by image), a scalar. Its float32 steps
are the NumPy path's, in its order: add ``(a - za) * ra + (b - zb) * rb + zc``, mul
``(a - za) * (b - zb) * r + zc``, then saturated and rounded half to even. Either returns
None where numba is off or the operands do not fit (the caller's NumPy path runs). Row
blocks on native threads; any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..lib.jit import Jitted

__all__ = ["channel_means", "compiled_binary", "compiled_lookup"]

numba: Any = None  # set by Jitted(parallel=True) before the loops below compile
_F32 = np.float32
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))
#: elements per parallel block
_BLOCK = 16384


def _rows(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``x`` broadcast to ``shape`` as a (rows, last axis) view, None if that needs a copy."""
    v = np.broadcast_to(x, shape)
    w = v.view()
    try:
        w.shape = (int(np.prod(shape[:-1])), shape[-1])
    except AttributeError:  # the broadcast strides do not merge
        return None
    return w


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
        shape = a.shape
        rows = (-1, shape[-1])
        a2 = np.ascontiguousarray(a).reshape(rows)
        b2 = np.ascontiguousarray(b).reshape(rows)
    else:
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            return None
        if not shape:
            return None
        a2, b2 = _rows(a, shape), _rows(b, shape)  # type: ignore[assignment]
        if a2 is None or b2 is None:
            return _per_image(fn, add, a, b, params, dt, shape)
    y = np.empty(shape, dt)
    if y.size:
        native_threads.enter_for(y.size, intra_pool().threads)
        fn(add, a2, b2, params, y.reshape(a2.shape))
    return y


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
    fn = _LOOKUP.get()
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
    fn = _MEANS.get()
    if fn is None or x.dtype not in _EIGHT_BIT or x.ndim < 3 or x.size == 0:
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
    fn(xs, last, np.int64(zx), _F32(scale), _F32(zy), _F32(info.min), _F32(info.max),
       y.reshape(n, c))  # fmt: skip
    return y


def _means(x, last, zx, scale, zy, lo, hi, y):  # pragma: no cover - numba only
    n_, c_ = y.shape
    p_ = x.shape[1] if last else x.shape[2]
    off = zx * p_
    if last:  # (N, P, C): per image, the pixels' channel vectors summed in int32
        for n in numba.prange(n_):
            acc = np.zeros(c_, np.int64)
            for p0 in range(0, p_, 8192):  # int32 partial sums: 8192 * 255 fits
                part = np.zeros(c_, np.int32)
                for p in range(p0, min(p_, p0 + 8192)):
                    row = x[n, p]
                    for c in range(c_):
                        part[np.uint64(c)] += np.int32(row[np.uint64(c)])
                for c in range(c_):
                    acc[c] += part[c]
            for c in range(c_):
                v = np.rint(np.float32(acc[c] - off) * scale) + zy
                y[n, c] = min(max(v, lo), hi)
    else:  # (N, C, P): one contiguous run per channel, channels in blocks of ~64K codes
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


def _warm_means(fn: Any) -> None:
    one = _F32(1)
    for dt in _EIGHT_BIT:
        for last in (True, False):
            for ydt in _EIGHT_BIT:
                fn(np.ones((1, 2, 3), dt), last, np.int64(0), one, one, _F32(0), _F32(255),
                   np.empty((1, 3) if last else (1, 2), ydt))  # fmt: skip


def _qbinary(add, a, b, params, y):  # pragma: no cover - numba only
    rows, cols = y.shape
    za, zb, r0, r1, zc, lo, hi = (params[0], params[1], params[2], params[3], params[4],
                                  params[5], params[6])  # fmt: skip
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    per = max(1, 16384 // max(cols, 1))
    for blk in numba.prange((rows + per - 1) // per):
        for r in range(blk * per, min(rows, blk * per + per)):
            ar, br, yr = a[r], b[r], y[r]
            if add:
                for j in range(cols):
                    v = (np.float32(ar[j]) - za) * r0 + (np.float32(br[j]) - zb) * r1
                    v = min(max(v + zc, lo), hi)
                    yr[j] = (v + magic) - magic
            else:
                for j in range(cols):
                    v = (np.float32(ar[j]) - za) * (np.float32(br[j]) - zb) * r0
                    v = min(max(v + zc, lo), hi)
                    yr[j] = (v + magic) - magic


def _qlookup(x, table, y):  # pragma: no cover - numba only
    n = x.shape[0]
    for blk in numba.prange((n + 16383) // 16384):
        for i in range(blk * 16384, min(n, blk * 16384 + 16384)):
            u = np.uint64(i)
            y[u] = table[x[u]]


def _warm_binary(fn: Any) -> None:
    p = np.ones(7, _F32)
    for dt in _EIGHT_BIT:
        x = np.ones((2, 3), dt)
        row = np.broadcast_to(np.ones((1, 3), dt), (2, 3))
        for add in (True, False):
            fn(add, x, x, p, np.empty((2, 3), dt))
            fn(add, x, row, p, np.empty((2, 3), dt))
            fn(add, row, x, p, np.empty((2, 3), dt))


def _warm_lookup(fn: Any) -> None:
    for dt in _EIGHT_BIT:
        fn(np.zeros(3, np.uint8), np.zeros(256, dt), np.empty(3, dt))


_BINARY = Jitted(_qbinary, _warm_binary, parallel=True)
_LOOKUP = Jitted(_qlookup, _warm_lookup, parallel=True)
_MEANS = Jitted(_means, _warm_means, parallel=True)
