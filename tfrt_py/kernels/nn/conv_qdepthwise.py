"""Depthwise QLinearConv on integer codes (group = channels, one filter each), exact.

``y[c] = saturate(rint(float32(sum_taps (x - x_zp) * (w[c] - w_zp[c]) + bias[c]) * scale[c])
+ y_zp)``, ``scale = x_scale * w_scale[c] / y_scale``, the input's zero point in the
padding: the integer formulation of ``conv_qint8``, whose requantize it shares.

The sums run in **float32** wherever that is exact: every product is at most 255 x 255 in
magnitude, so a window of ``KH * KW`` taps plus the bias stays below 2**24, where float32
holds every integer, when ``KH * KW * 255**2 + max|bias| < 2**24`` (3x3: biases below
~16.2 million) -- the same integers as int32 sums, in any order, and LLVM vectorizes
float32 multiply-adds (numba widens int32 products to int64, which AVX2 has no vector
multiply for: the int32 form ran at ~3.6 G multiply-adds/s on a Zen 3 core, the float32
3x3 form several times that). Elsewhere (larger windows or biases) the same source runs
on int32 arrays. ``QDepthwisePlan.sums`` says which.

Channels-last (N, H, W, C), the layout ``compiler/channels_last.py`` gives a quantized
CNN. Float32 sums over whole vectors of 8 channels in a 3x3, 5x5 or 7x7 window
(MobileNet's, EfficientNet's, ConvNeXt's): per band of output rows on native threads,
each input row the band reads staged once (minus the zero point, as float32, zero padded)
into a ring of the window's reach, and each output row by ``lib/qdepthwise_ir``'s kernel,
which holds a vector of channels' weights in registers while the row's pixels stream past
(``kernel_rows``; 2-3x the loop below on a Zen 5 core). Otherwise per band of output rows,
the rows the band reads staged into the band's own buffer (``BAND_BYTES``: it stays in
L2), then per output pixel a vector over the channels: for 3x3 the nine taps in one
expression (no accumulator traffic), the requantize in the same loop.
NCHW: per plane, the padded plane, then tap by tap over it.

``plan_depthwise(...)`` makes the load-time part (None where numba is missing or the conv
is outside this form); ``QDepthwisePlan.run`` is called per batch from any thread: each
call's buffers are its own.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..common import ShapeMemo
from ..lib import qdepthwise_ir
from ..lib.jit import Jitted

__all__ = ["F32_EXACT", "QDepthwisePlan", "plan_depthwise"]

numba: Any = None  # set by Jitted(parallel=True) before the loops below compile
qdw_3x3: Any = None  # the row kernel's ExternalFunctions, set by _prepare_rows
qdw_5x5: Any = None
qdw_7x7: Any = None

#: input shapes a plan keeps the per-shape part of its calls for (``ShapeMemo``)
_CALLS_MAX = 64
#: Integers up to this magnitude are exact in float32.
F32_EXACT = 1 << 24


class QDepthwisePlan(NamedTuple):
    """The load-time half of a depthwise QLinearConv. Immutable."""

    w: np.ndarray  # (C, KH, KW) in the sums' type: the weights minus their zero points
    w_last: np.ndarray  # the same as (KH, KW, C), for channels-last inputs
    bias: np.ndarray  # per channel, in the sums' type
    scale: np.ndarray  # float32 per channel
    x_zp: Any  # the input's zero point, a scalar of the sums' type
    y_zp: float
    lo: float
    hi: float
    x_dtype: np.dtype
    y_dtype: np.dtype
    geo: np.ndarray  # int64: kh, kw, sh, sw, dh, dw, pad top, left, bottom, right
    kernel: Any
    kernel_last: Any
    sums: str  # "float32" (exact there: module doc) or "int32"
    kernel_rows: Any  # channels-last by qdepthwise_ir's row kernel, or None
    params: np.ndarray  # float32 [lo - y_zp, hi - y_zp, y_zp], the row kernel's

    calls: ShapeMemo[tuple[Any, ...], tuple[tuple[int, ...], int, int]]  # ``_layout``'s

    def run(self, x: np.ndarray, channels_last: bool = False) -> np.ndarray | None:
        """y for ``x`` (N, C, H, W), or (N, H, W, C) -> (N, OH, OW, C) with
        ``channels_last``; None when ``x`` does not fit the plan."""
        if x.dtype != self.x_dtype:
            return None
        lay = self.calls.made((x.shape, channels_last), _layout, self, x.shape, channels_last)
        if lay is None:
            return None
        y_shape, work, band = lay
        y = np.empty(y_shape, self.y_dtype)
        if y_shape[0]:
            native_threads.enter_for(work, intra_pool().threads)
            xc = np.ascontiguousarray(x)
            if channels_last and self.kernel_rows is not None:
                self.kernel_rows(xc, self.x_zp, self.geo, self.w_last, self.bias, self.scale,
                                 self.params, y, band)  # fmt: skip
            elif channels_last:
                self.kernel_last(xc, self.x_zp, self.geo, self.w_last, self.bias, self.scale,
                                 self.y_zp, self.lo, self.hi, y, band)  # fmt: skip
            else:
                self.kernel(xc, self.x_zp, self.geo, self.w, self.bias, self.scale, self.y_zp,
                            self.lo, self.hi, y)  # fmt: skip
        return y


def _layout(p: QDepthwisePlan, shape: tuple[int, ...],
            channels_last: bool) -> tuple[tuple[int, ...], int, int] | None:  # fmt: skip
    """``run``'s per-shape part: (output shape, multiply-adds, channels-last band), or
    None when an input of ``shape`` does not fit the plan."""
    c = p.w.shape[0]
    if len(shape) != 4 or shape[3 if channels_last else 1] != c:
        return None
    kh, kw, sh, sw, dh, dw, pt, pl, pb, pr = (int(v) for v in p.geo)
    n, h, w = (shape[0], shape[1], shape[2]) if channels_last else (shape[0], *shape[2:])
    oh = (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (w + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    if oh <= 0 or ow <= 0:
        return None
    wp = max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    if channels_last and p.kernel_rows is not None:  # a ring of rows: any band fits
        band = max(1, -(-oh // MIN_BANDS))
    else:
        band = _band(oh, sh, (kh - 1) * dh + 1, wp * c * p.w.dtype.itemsize)
    y_shape = (n, oh, ow, c) if channels_last else (n, c, oh, ow)
    return y_shape, n * oh * ow * c * kh * kw, band


#: Bytes of input rows a channels-last band converts for its output rows (within L2).
BAND_BYTES = 192 * 1024
#: At least this many bands per image where there are rows for them (the threads' parts).
MIN_BANDS = 4


def _band(oh: int, sh: int, reach: int, row_bytes: int) -> int:
    """Output rows a channels-last band computes: its input rows (``(band - 1) * sh +
    reach``) within ``BAND_BYTES``, and at least ``MIN_BANDS`` bands when ``oh`` allows."""
    fit = (BAND_BYTES // max(row_bytes, 1) - reach) // sh + 1
    return max(1, min(fit, -(-oh // MIN_BANDS)))


def plan_depthwise(
    w: np.ndarray, w_scale: Any, w_zp: Any, x_scale: Any, x_zp: Any, y_scale: Any, y_zp: Any,
    bias: Any, geo: tuple[int, ...],
) -> QDepthwisePlan | None:  # fmt: skip
    """The plan of a depthwise QLinearConv (``w`` (C, 1, KH, KW)) with these constants, or
    None (numba missing, scales or zero points of other lengths, sums beyond int32)."""
    if (
        not _QDEPTHWISE.usable()
        or not _QDEPTHWISE_LAST.usable()
        or w.ndim != 4
        or w.shape[1] != 1
        or w.dtype not in (np.uint8, np.int8)
    ):
        return None
    c = w.shape[0]
    sizes = [np.asarray(v).size for v in (x_scale, x_zp, y_scale, y_zp) if v is not None]
    if any(s != 1 for s in sizes) or any(
        v is not None and np.asarray(v).size not in (1, c) for v in (w_scale, w_zp)
    ):
        return None
    taps = w.shape[2] * w.shape[3]
    if taps * 255 * 255 >= 2**31:
        return None
    xdt = np.dtype(np.uint8) if x_zp is None else np.asarray(x_zp).dtype
    ydt = np.dtype(np.uint8) if y_zp is None else np.asarray(y_zp).dtype
    if xdt not in (np.uint8, np.int8) or ydt not in (np.uint8, np.int8):
        return None
    wz = 0 if w_zp is None else np.asarray(w_zp).astype(np.int64).reshape(-1, 1, 1)
    wi = w[:, 0].astype(np.int64) - wz
    b = np.zeros(c, np.int64) if bias is None else np.asarray(bias).astype(np.int64)
    if b.shape != (c,) or np.abs(b).max(initial=0) >= 2**31 - taps * 255 * 255:
        return None
    exact = taps * 255 * 255 + int(np.abs(b).max(initial=0)) < F32_EXACT
    st = np.dtype(np.float32) if exact else np.dtype(np.int32)
    scale = np.asarray(x_scale) * np.asarray(w_scale).reshape(-1) / np.asarray(y_scale)
    scale = np.broadcast_to(np.asarray(scale, np.float32), (c,)).copy()
    info = np.iinfo(ydt)
    zx = 0 if x_zp is None else int(np.asarray(x_zp).reshape(()))
    zy = 0.0 if y_zp is None else float(np.asarray(y_zp).reshape(()))
    types = (st, xdt, ydt)
    fn = _QDEPTHWISE.get_for(types, functools.partial(_warm_depthwise, False, *types))
    fn_last = _QDEPTHWISE_LAST.get_for(types, functools.partial(_warm_depthwise, True, *types))
    if fn is None or fn_last is None:
        return None
    ws = wi.astype(st)
    rows = None
    if exact and c % 8 == 0 and (w.shape[2], w.shape[3]) in qdepthwise_ir.WINDOWS:
        rows = _QDEPTHWISE_ROWS.get()
    params = np.array([info.min - zy, info.max - zy, zy], np.float32)
    return QDepthwisePlan(ws, np.ascontiguousarray(ws.transpose(1, 2, 0)), b.astype(st),
                          scale, st.type(zx), zy, float(info.min), float(info.max), xdt, ydt,
                          np.array(geo, np.int64), fn, fn_last, st.name, rows, params,
                          ShapeMemo(_CALLS_MAX))  # fmt: skip


def _qdepthwise(x, zx, geo, w, bias, scale, zy, lo, hi, y):  # pragma: no cover - numba only
    # x (N, C, H, W), w (C, KH, KW): per plane on native threads
    n_, c_, h_, w_ = x.shape
    kh, kw, sh, sw, dh, dw, pt, pl = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    oh_, ow_ = y.shape[2], y.shape[3]
    hp = max(h_ + pt, (oh_ - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w_ + pl, (ow_ - 1) * sw + (kw - 1) * dw + 1)
    flo, fhi, fz = np.float32(lo - zy), np.float32(hi - zy), np.float32(zy)
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    us = np.uint64(sw)
    for nc in numba.prange(n_ * c_):  # unsigned indices: the loops vectorize
        n = nc // c_
        c = nc - n * c_
        xp = np.zeros(hp * wp, w.dtype)  # the input minus its zero point, zero padded
        for ih in range(h_):
            src = x[n, c, ih]
            d = np.uint64((ih + pt) * wp + pl)
            for iw in range(w_):
                xp[d + np.uint64(iw)] = src[np.uint64(iw)] - zx
        acc = np.zeros(oh_ * ow_, w.dtype)
        for i in range(kh):
            for j in range(kw):
                wv = w[c, i, j]
                for oh in range(oh_):
                    a0 = np.uint64(oh * ow_)
                    x0 = np.uint64((oh * sh + i * dh) * wp + j * dw)
                    if sw == 1:
                        for ow in range(ow_):
                            acc[a0 + np.uint64(ow)] += wv * xp[x0 + np.uint64(ow)]
                    else:
                        for ow in range(ow_):
                            acc[a0 + np.uint64(ow)] += wv * xp[x0 + np.uint64(ow) * us]
        bq, sq = bias[c], scale[c]
        out = y[n, c]
        for oh in range(oh_):
            orow = out[oh]
            a0 = np.uint64(oh * ow_)
            for ow in range(ow_):
                v = min(max(np.float32(acc[a0 + np.uint64(ow)] + bq) * sq, flo), fhi)
                orow[np.uint64(ow)] = ((v + magic) - magic) + fz


def _qdepthwise_last(x, zx, geo, w, bias, scale, zy, lo, hi, y, band):  # pragma: no cover
    # x (N, H, W, C), w (KH, KW, C), y (N, OH, OW, C): per band of ``band`` output rows on
    # native threads; per band, the input rows it reads minus the zero point as the sums'
    # type, zero padded, into a buffer of its own (sized to stay in L2), then its rows
    n_, _, w_, c_ = x.shape
    kh, kw, sh, sw, dh, dw, pt, pl = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    oh_, ow_ = y.shape[1], y.shape[2]
    wp = max(w_ + pl, (ow_ - 1) * sw + (kw - 1) * dw + 1)
    flo, fhi, fz = np.float32(lo - zy), np.float32(hi - zy), np.float32(zy)
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    uc = np.uint64(c_)
    rowlen = np.uint64(wp) * uc
    dj = np.uint64(dw) * uc
    di = np.uint64(dh) * rowlen
    nb = (oh_ + band - 1) // band
    for task in numba.prange(n_ * nb):
        n = task // nb
        b0 = (task - n * nb) * band
        b1 = min(oh_, b0 + band)
        rows = (b1 - 1 - b0) * sh + (kh - 1) * dh + 1
        xs = np.empty(rows * wp * c_, w.dtype)
        _stage_band(x, zx, n, b0 * sh - pt, rows, pl, wp, xs)
        for oh in range(b0, b1):
            base = np.uint64((oh - b0) * sh) * rowlen
            out = y[n, oh].reshape(-1)
            if kh == 3 and kw == 3:  # the nine taps in one expression per channel vector
                w0, w1, w2, w3, w4 = w[0, 0], w[0, 1], w[0, 2], w[1, 0], w[1, 1]
                w5, w6, w7, w8 = w[1, 2], w[2, 0], w[2, 1], w[2, 2]
                for ow in range(ow_):
                    p0 = base + np.uint64(ow * sw) * uc
                    p1, p3 = p0 + dj, p0 + di
                    p2, p4, p6 = p1 + dj, p3 + dj, p3 + di
                    p5, p7 = p4 + dj, p6 + dj
                    p8 = p7 + dj
                    o = np.uint64(ow) * uc
                    for c in range(c_):
                        u = np.uint64(c)
                        s = (
                            (w0[u] * xs[p0 + u] + w1[u] * xs[p1 + u] + w2[u] * xs[p2 + u])
                            + (w3[u] * xs[p3 + u] + w4[u] * xs[p4 + u] + w5[u] * xs[p5 + u])
                            + (w6[u] * xs[p6 + u] + w7[u] * xs[p7 + u] + w8[u] * xs[p8 + u])
                        )
                        v = min(max(np.float32(s + bias[u]) * scale[u], flo), fhi)
                        out[o + u] = ((v + magic) - magic) + fz
                continue
            acc = np.empty(c_, w.dtype)
            if kw == 5:  # a row of taps in one expression per channel vector (EfficientNet)
                for ow in range(ow_):
                    p0 = base + np.uint64(ow * sw) * uc
                    for i in range(kh):
                        q0 = p0 + np.uint64(i) * di
                        q1, q2 = q0 + dj, q0 + dj + dj
                        q3 = q2 + dj
                        q4 = q3 + dj
                        v0, v1, v2, v3, v4 = w[i, 0], w[i, 1], w[i, 2], w[i, 3], w[i, 4]
                        if i == 0:
                            for c in range(c_):
                                u = np.uint64(c)
                                acc[u] = (v0[u] * xs[q0 + u] + v1[u] * xs[q1 + u]) + (
                                    v2[u] * xs[q2 + u] + v3[u] * xs[q3 + u] + v4[u] * xs[q4 + u]
                                )
                        else:
                            for c in range(c_):
                                u = np.uint64(c)
                                acc[u] += (v0[u] * xs[q0 + u] + v1[u] * xs[q1 + u]) + (
                                    v2[u] * xs[q2 + u] + v3[u] * xs[q3 + u] + v4[u] * xs[q4 + u]
                                )
                    o = np.uint64(ow) * uc
                    for c in range(c_):
                        u = np.uint64(c)
                        v = min(max(np.float32(acc[u] + bias[u]) * scale[u], flo), fhi)
                        out[o + u] = ((v + magic) - magic) + fz
                continue
            for ow in range(ow_):
                acc[:] = 0
                for i in range(kh):
                    for j in range(kw):
                        wt = w[i, j]
                        x0 = base + np.uint64(i) * di + np.uint64(ow * sw) * uc + np.uint64(j) * dj
                        for c in range(c_):
                            u = np.uint64(c)
                            acc[u] += wt[u] * xs[x0 + u]
                o = np.uint64(ow) * uc
                for c in range(c_):
                    u = np.uint64(c)
                    v = min(max(np.float32(acc[u] + bias[u]) * scale[u], flo), fhi)
                    out[o + u] = ((v + magic) - magic) + fz


def _stage_band(x, zx, n, ih0, rows, pl, wp, xs):  # pragma: no cover - numba only
    # rows ih0.. of image n of x (N, H, W, C) minus the zero point into xs (rows, wp, C),
    # zero padded: rows outside the image, pl columns before it, the rest after it
    h_, w_, c_ = x.shape[1], x.shape[2], x.shape[3]
    uc = np.uint64(c_)
    rowlen = np.uint64(wp) * uc
    for r in range(rows):
        ih = ih0 + r
        d = np.uint64(r) * rowlen
        if ih < 0 or ih >= h_:
            for q in range(wp * c_):
                xs[d + np.uint64(q)] = 0
            continue
        src = x[n, ih].reshape(-1)
        for q in range(pl * c_):
            xs[d + np.uint64(q)] = 0
        d2 = d + np.uint64(pl) * uc
        for q in range(w_ * c_):
            xs[d2 + np.uint64(q)] = src[np.uint64(q)] - zx
        for q in range((pl + w_) * c_, wp * c_):
            xs[d + np.uint64(q)] = 0


def _qdepthwise_rows(x, zx, geo, w, bias, scale, params, y, band):  # pragma: no cover
    # channels-last as _qdepthwise_last, float32 sums, C a multiple of 8, a window the row
    # kernel has: per band of output rows on native threads, the input rows staged as
    # there but each once, into a ring of the window's reach, then each output row by
    # qdepthwise_ir's kernel (w tap-major (KH * KW, C)) over the ring's rows
    n_, _, w_, c_ = x.shape
    kh, kw, sh, sw, dh, dw, pt, pl = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    oh_, ow_ = y.shape[1], y.shape[2]
    wp = max(w_ + pl, (ow_ - 1) * sw + (kw - 1) * dw + 1)
    rowlen = wp * c_
    reach = (kh - 1) * dh + 1
    nb = (oh_ + band - 1) // band
    for task in numba.prange(n_ * nb):
        n = task // nb
        b0 = (task - n * nb) * band
        b1 = min(oh_, b0 + band)
        raw = np.empty(reach * rowlen + 16, np.float32)  # the ring from a 64-byte line:
        a0 = ((-raw.ctypes.data) & 63) // 4  # the kernel's vector loads split no line
        ring = raw[a0 : a0 + reach * rowlen]
        addrs = np.empty(kh, np.int64)
        first = b0 * sh - pt  # the band's first input row: ring slot (row - first) % reach
        staged = first
        for oh in range(b0, b1):
            top = oh * sh - pt
            for ih in range(max(staged, top), top + reach):
                at = ((ih - first) % reach) * rowlen
                _stage_band(x, zx, n, ih, 1, pl, wp, ring[at : at + rowlen])
            staged = top + reach
            for i in range(kh):
                addrs[i] = ring.ctypes.data + ((top + i * dh - first) % reach) * rowlen * 4
            dst = y[n, oh].ctypes.data
            rows_at, w_at, b_at = addrs.ctypes.data, w.ctypes.data, bias.ctypes.data
            s_at, p_at = scale.ctypes.data, params.ctypes.data
            if kh == 3:
                qdw_3x3(rows_at, c_, dw * c_, sw * c_, w_at, b_at, s_at, p_at, dst, ow_)
            elif kh == 5:
                qdw_5x5(rows_at, c_, dw * c_, sw * c_, w_at, b_at, s_at, p_at, dst, ow_)
            else:
                qdw_7x7(rows_at, c_, dw * c_, sw * c_, w_at, b_at, s_at, p_at, dst, ow_)


def _warm_depthwise(last: bool, st: Any, xdt: Any, ydt: Any, fn: Any) -> None:
    """Compile the NCHW (``last`` False) or channels-last depthwise kernel for one sum type
    and one pair of input and output 8-bit types (a plan's: ``plan_depthwise``), by calls
    with 3x3, 1x2 and 2x5 windows over one 4x4 channel."""
    st = np.dtype(st).type
    for kh, kw in ((3, 3), (1, 2), (2, 5)):
        geo = np.array([kh, kw, 1, 1, 1, 1, 0, 0, 0, 0], np.int64)
        shape = (1, 4, 4, 1) if last else (1, 1, 4, 4)
        oshape = (1, 5 - kh, 5 - kw, 1) if last else (1, 1, 5 - kh, 5 - kw)
        w = np.ones((kh, kw, 1) if last else (1, kh, kw), st)
        args = (np.ones(shape, xdt), st(0), geo, w, np.zeros(1, st), np.ones(1, np.float32),
                0.0, 0.0, 255.0, np.empty(oshape, ydt))  # fmt: skip
        fn(*args, *((2,) if last else ()))


#: no warm-ups of their own: each plan compiles its sum and 8-bit types (``get_for``)
_QDEPTHWISE = Jitted(_qdepthwise, parallel=True)
_QDEPTHWISE_LAST = Jitted(_qdepthwise_last, helpers=(_stage_band,), parallel=True)


def _prepare_rows(module_globals: dict[str, Any]) -> bool:
    fns = {k: qdepthwise_ir.kernel(*k) for k in qdepthwise_ir.WINDOWS}
    for (kh, kw), fn in fns.items():
        module_globals[f"qdw_{kh}x{kw}"] = fn
    return None not in fns.values()


def _warm_rows(fn: Any) -> None:
    for k, _ in qdepthwise_ir.WINDOWS:
        geo = np.array([k, k, 1, 1, 1, 1, k // 2, k // 2, k // 2, k // 2], np.int64)
        w = np.ones((k, k, 8), np.float32)
        params = np.array([0.0, 255.0, 0.0], np.float32)
        for xdt in (np.uint8, np.int8):
            for ydt in (np.uint8, np.int8):
                fn(np.ones((1, 4, 4, 8), xdt), np.float32(0), geo, w, np.zeros(8, np.float32),
                   np.ones(8, np.float32), params, np.empty((1, 4, 4, 8), ydt), 2)  # fmt: skip


_QDEPTHWISE_ROWS = Jitted(_qdepthwise_rows, _warm_rows, helpers=(_stage_band,), parallel=True,
                          prepare=_prepare_rows)  # fmt: skip
