"""The compiled im2col: a conv's input rearranged into the columns of its product
(``cols[(c, i, j), (oh - oh0) * OW + ow] = x[n, c, oh*sh - pt + i*dh, ow*sw - pl + j*dw]``,
zero in the padding), straight from the unpadded input, for ``conv_blocked``'s blocks.

* ``im2col_rows``: channels ``[c0, c1)`` and output rows ``[oh0, oh1)`` of one image; it
  picks the fastest form for the geometry:
* ``im2col_rows_flat``: stride 1 with output rows as wide as the input's ("same" padding
  across): each tap's rows are one shifted run of the flattened channel;
* ``im2col_rows_s2``: a column stride of 2 over wide rows, from the channel's even and
  odd column planes;
* otherwise one copy per (tap, output row), zeros where the tap falls in the padding;
* ``IM2COL_PAR``: whole images in blocks of channels on native threads (the filter-block
  path's im2col).

numba only (``IM2COL.get()`` is None without it). Thread-safe: no state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted, inline, uses

__all__ = ["IM2COL", "IM2COL_PAR", "im2col_rows", "im2col_rows_flat", "im2col_rows_s2"]


@inline
def _copy_tap(  # pragma: no cover - numba only
    row: Any, plane: Any, ih0: int, sh: int, oh0: int, oh1: int, off: int, sw: int, w_: int,
    ow_: int, c0: int, step: int,
) -> None:  # fmt: skip
    """One tap's im2col row for output rows ``[oh0, oh1)``: output (oh, ow) is input row
    ``oh * sh + ih0``, column ``ow * sw + off`` (of ``w_``), read at ``plane[oh * sh + ih0,
    c0 + ow * step]``; zero where that falls outside the image. Inlined (``jit.inline``)."""
    h_ = plane.shape[0]
    zero = row.dtype.type(0)
    # the output columns whose tap lands inside the row: lo <= ow < hi
    lo = 0 if off >= 0 else (-off + sw - 1) // sw
    hi = (w_ - 1 - off) // sw + 1 if w_ - 1 - off >= 0 else 0
    hi = min(hi, ow_)
    lo = min(lo, hi)
    for oh in range(oh0, oh1):
        ih = oh * sh + ih0
        d = np.uint64((oh - oh0) * ow_)
        if ih < 0 or ih >= h_:
            for t in range(ow_):
                row[d + np.uint64(t)] = zero
            continue
        src = plane[ih]
        for t in range(lo):
            row[d + np.uint64(t)] = zero
        base = np.uint64(c0 + lo * step)
        dl = d + np.uint64(lo)
        if step == 1:
            for t in range(hi - lo):
                row[dl + np.uint64(t)] = src[base + np.uint64(t)]
        else:
            su = np.uint64(step)
            for t in range(hi - lo):
                row[dl + np.uint64(t)] = src[base + np.uint64(t) * su]
        for t in range(hi, ow_):
            row[d + np.uint64(t)] = zero


def im2col_rows_flat(  # pragma: no cover - numba only
    x: Any, n: int, cols: Any, geo: Any, c0: int, c1: int, oh0: int, oh1: int
) -> None:
    """``im2col_rows`` for stride 1 with output rows as wide as the input's ("same"
    padding across): a tap's rows ``[oh0, oh1)`` are then one contiguous run of the
    flattened channel, shifted by the tap's offset. Copy that run in one loop, then zero
    the padding columns it filled from the neighbouring rows, and the rows above or
    below the image: per tap one long copy instead of one short copy per output row (a
    14x14 plane's runs of 14 cost ~6 ns each, most of the copy)."""
    h_, w_ = x.shape[2], x.shape[3]
    kh_, kw_, dh, dw, pt, pl, ow_ = geo[0], geo[1], geo[4], geo[5], geo[6], geo[7], geo[8]
    zero = cols.dtype.type(0)
    hw = h_ * w_
    r = 0
    for c in range(c0, c1):
        xf = x[n, c].reshape(hw)
        for i in range(kh_):
            # output rows whose input row ih = oh - pt + i * dh is inside the image
            a = min(max(oh0, pt - i * dh), oh1)
            e = max(min(oh1, h_ + pt - i * dh), a)
            for j in range(kw_):
                row = cols[r]
                r += 1
                off = j * dw - pl
                lo = min(max(0, -off), ow_)  # columns [lo, hi) read inside the row
                hi = max(min(ow_, w_ - off), lo)
                for t in range((a - oh0) * ow_):
                    row[t] = zero
                for t in range((e - oh0) * ow_, (oh1 - oh0) * ow_):
                    row[t] = zero
                if e == a:
                    continue
                d0 = (a - oh0) * ow_
                s0 = (a - pt + i * dh) * w_ + off
                # the run, less what would fall outside the plane (padding columns of
                # the first or last row, zeroed below)
                t0 = max(0, -s0)
                t1 = min((e - a) * ow_, hw - s0)
                du, su = np.uint64(d0), np.uint64(s0 + t0)
                for t in range(t1 - t0):
                    row[du + np.uint64(t0 + t)] = xf[su + np.uint64(t)]
                if lo > 0 or hi < ow_:
                    for oh in range(a, e):
                        b = (oh - oh0) * ow_
                        for t in range(lo):
                            row[b + t] = zero
                        for t in range(hi, ow_):
                            row[b + t] = zero


@uses(_copy_tap)
def im2col_rows_s2(  # pragma: no cover - numba only
    x: Any, n: int, cols: Any, geo: Any, c0: int, c1: int, oh0: int, oh1: int
) -> None:
    """``im2col_rows`` for a column stride of 2 (no column dilation): each channel's
    plane is split once into its even and odd columns (one interleaved loop, which LLVM
    vectorizes), so that every tap's copy is a contiguous run of one of them instead of a
    strided gather (the ResNet stem's 7x7/2 im2col was 1.6 ns an element)."""
    h_, w_ = x.shape[2], x.shape[3]
    kh_, kw_, sh, dh, pt, pl, ow_ = geo[0], geo[1], geo[2], geo[4], geo[6], geo[7], geo[8]
    half = (w_ + 1) // 2
    ph = np.empty((2, h_, half), cols.dtype)  # [even columns, odd columns] of one channel
    npair = w_ // 2
    # only the input rows these output rows read (a block of a few output rows split
    # every row of the plane: the ResNet stem's 28 blocks each split all 224)
    ih0 = max(0, oh0 * sh - pt)
    ih1 = min(h_, (oh1 - 1) * sh - pt + (kh_ - 1) * dh + 1)
    r = 0
    for c in range(c0, c1):
        xc = x[n, c]
        for ih in range(ih0, ih1):
            ev, od = ph[0, ih], ph[1, ih]
            for k in range(npair):
                u = np.uint64(k)
                ev[u] = xc[ih, np.uint64(2) * u]
                od[u] = xc[ih, np.uint64(2) * u + np.uint64(1)]
            if w_ % 2:
                ev[npair] = xc[ih, w_ - 1]
        for i in range(kh_):
            for j in range(kw_):
                off = j - pl  # input column 2 * ow + off: phase off % 2, at ow + off // 2
                plane = ph[off % 2]
                _copy_tap(cols[r], plane, i * dh - pt, sh, oh0, oh1, off, 2, w_, ow_, off // 2, 1)
                r += 1


@uses(_copy_tap, im2col_rows_s2, im2col_rows_flat)
def im2col_rows(  # pragma: no cover - numba only
    x: Any, n: int, cols: Any, geo: Any, c0: int, c1: int, oh0: int, oh1: int
) -> None:
    """cols[(c - c0, i, j), (oh - oh0) * OW + ow] =
    x[n, c, oh*sh - pt + i*dh, ow*sw - pl + j*dw] for channels c0 <= c < c1, zero outside
    the image. ``geo`` = [KH, KW, sh, sw, dh, dw, pt, pl, OW]."""
    w_ = x.shape[3]
    kh_, kw_, sh, sw, dh, dw, pt, pl, ow_ = (
        geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8],
    )  # fmt: skip
    if sw == 2 and dw == 1 and ow_ >= 16:
        im2col_rows_s2(x, n, cols, geo, c0, c1, oh0, oh1)
        return
    if sh == 1 and sw == 1 and ow_ == w_:
        im2col_rows_flat(x, n, cols, geo, c0, c1, oh0, oh1)
        return
    r = 0
    for c in range(c0, c1):
        xc = x[n, c]
        for i in range(kh_):
            for j in range(kw_):
                off = j * dw - pl
                _copy_tap(cols[r], xc, i * dh - pt, sh, oh0, oh1, off, sw, w_, ow_, off, sw)
                r += 1


def _warm_im2col(fn: Any) -> None:
    t = np.float32  # the models' dtype; another compiles on its first use (warm.py)
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 2], np.int64)
    fn(np.zeros((1, 1, 2, 2), t), 0, np.zeros((9, 4), t), geo, 0, 1, 0, 2)


IM2COL = Jitted(im2col_rows, _warm_im2col)

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles.
numba: Any = None


def _im2col_par(x: Any, cols: Any, geo: Any, blocks: Any) -> None:  # pragma: no cover
    """``im2col_rows`` for whole images in blocks of channels (rows ``(image, c0, c1)``)
    in a ``prange`` loop on native threads: ``cols`` (N, C * KH * KW, OH * OW), channel
    ``c``'s rows at ``c * KH * KW``. The filter-block path's im2col (one per image before
    its product), which ran on the caller alone: 194 µs of a 256 -> 256 3x3 conv's 1425
    over 14x14."""
    taps = geo[0] * geo[1]
    oh = cols.shape[2] // geo[8]
    for q in numba.prange(blocks.shape[0]):
        i, c0, c1 = blocks[q, 0], blocks[q, 1], blocks[q, 2]
        im2col_rows(x, i, cols[i, c0 * taps : c1 * taps], geo, c0, c1, 0, oh)


def _warm_im2col_par(fn: Any) -> None:
    t = np.float32
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 2], np.int64)
    blocks = np.array([[0, 0, 1], [0, 1, 2]], np.int64)
    fn(np.zeros((1, 2, 2, 2), t), np.zeros((1, 18, 4), t), geo, blocks)


IM2COL_PAR = Jitted(
    _im2col_par,
    _warm_im2col_par,
    helpers=(im2col_rows,),
    parallel=True,
)
