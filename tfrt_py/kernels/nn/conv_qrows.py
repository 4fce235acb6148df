"""QLinearConv for few input channels (a stem: RGB, grayscale) on ``lib.qgemm_packed``'s
kernel without an im2row: the rows of A are read in place from a staged copy of the input.

A stem's im2row copied 3 bytes a tap through short loops per output pixel and took most of
the conv's time (MobileNetV2's 3x3/2 stem: 500 µs of a 2 ms int8 model). Here, per image:

1. the input is staged once, padded, as pixel words of ``CP`` = 4 channels (the channels
   past C and the padding hold the input's zero point): ``xp[(r * WP + col) * 4 + c]``;
2. per output row ``oh``, the ``KH`` padded input rows it reads are interleaved column by
   column into one buffer of words: ``xr[col * KH + i] = xp_word[(oh * SH + i) * WP +
   col]``. The taps of output pixel ``ow`` are then one contiguous run of ``KW * KH * 4``
   elements starting at column ``ow * SW``: A's rows, ``SW * KH * 4`` elements apart
   (overlapping), with the weights packed in the same (j, i, c) order;
3. one kernel call per output row requantizes as it stores (``qgemm_requant``), straight
   into channels-last output rows when Co is whole vectors, else through a small buffer.

The extra channel costs the products a third more multiply-adds at C = 3; the stem's
products are small next to what the im2row cost. Symmetric weights only (the plan's
caller keeps the im2row form for weights with zero points); dilation 1.

``plan_rows(w_taps_source, ...)`` packs the weights at load; ``run`` is called per batch
from any thread (each call's buffers are its own).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib import qgemm_packed
from ..lib.jit import Jitted

__all__ = ["CP", "MAX_CHANNELS", "kernel", "pack_rows", "staged_words"]

numba: Any = None  # set by Jitted(parallel=True) before the loop below compiles
qgemm_requant: Any = None  # the ExternalFunction, set by _prepare

#: channels a staged pixel holds (one int32 lane of u8 codes: VNNI's group)
CP = 4
#: convs with at most this many input channels take this form
MAX_CHANNELS = CP
#: output rows per block of the parallel loop (one interleave buffer each)
_ROWS_A_BLOCK = 4


def pack_rows(wi: np.ndarray, shape: Any) -> np.ndarray:
    """The signed weight codes ``wi`` (Co, C, KH, KW; C <= ``CP``) as the kernel's panels in
    the (j, i, c) tap order of the interleaved rows, the channels past C zero."""
    co, c, kh, kw = wi.shape
    full = np.zeros((co, CP, kh, kw), np.int64)
    full[:, :c] = wi
    return qgemm_packed.pack(full.transpose(3, 2, 1, 0).reshape(kw * kh * CP, co), shape)


def _qconv_rows(x, xp, words, x_shift, zx, geo, ow_, wp, layout, bias, scale, params, vw,
                y):  # pragma: no cover - numba only  # fmt: skip
    # geo: kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, h, w, flags (1: channels last: x (N, H*W,
    # C), y (N, P, Co); else x (N, C, H*W), y (N, Co, P); 4: x planar (N, C, H*W) whatever
    # y's layout: a channels-last view of planes). xp: the padded image's codes in
    # the kernel's A type, (H + pt + pb) * (W + pl + pr) * CP of them; words: the same
    # memory as one word a pixel (uint32 for bytes, uint64 for int16 codes).
    kh, sh, sw = geo[0], geo[2], geo[3]
    pt, pl, pb, pr = geo[6], geo[7], geo[8], geo[9]
    h_, w_, nhwc = geo[10], geo[11], (geo[12] & 1) != 0
    x_last = nhwc and (geo[12] & 4) == 0
    n_ = x.shape[0]
    c_ = x.shape[2] if x_last else x.shape[1]
    co_, p_ = (y.shape[2], y.shape[1]) if nhwc else (y.shape[1], y.shape[2])
    oh_ = p_ // ow_
    hp, wpd = h_ + pt + pb, w_ + pl + pr
    panels, kg, nr = wp.shape[0], wp.shape[1], wp.shape[2]
    lda = sw * kh * 4
    whole = nhwc and co_ % vw == 0
    ncols = panels * nr
    nblk = (oh_ + _ROWS_A_BLOCK - 1) // _ROWS_A_BLOCK
    bits = 8 * xp.itemsize  # a code's lane in the word
    mask = (1 << bits) - 1
    zword = 0  # the zero point in every lane (padding)
    zpad = 0  # ... in the lanes past the channels
    for c in range(4):
        zword |= (zx & mask) << (c * bits)
        if c >= c_:
            zpad |= (zx & mask) << (c * bits)
    for n in range(n_):
        for r in numba.prange(hp):
            ih = r - pt
            row = r * wpd
            if ih < 0 or ih >= h_:
                for col in range(wpd):
                    words[np.uint64(row + col)] = zword
                continue
            for col in range(pl):
                words[np.uint64(row + col)] = zword
            for col in range(pl + w_, wpd):
                words[np.uint64(row + col)] = zword
            src = ih * w_
            for iw in range(w_):
                wd = zpad
                s = np.uint64(src + iw)
                for c in range(c_):
                    v = np.int64(x[n, s, c] if x_last else x[n, c, s]) + x_shift
                    wd |= (v & mask) << (c * bits)
                words[np.uint64(row + pl + iw)] = wd
        for blk in numba.prange(nblk):
            xr = np.empty(wpd * kh, words.dtype)
            t8 = np.empty(0 if whole else ow_ * ncols, y.dtype)
            for oh in range(blk * _ROWS_A_BLOCK, min(oh_, (blk + 1) * _ROWS_A_BLOCK)):
                for i in range(kh):
                    src = (oh * sh + i) * wpd
                    for col in range(wpd):
                        xr[np.uint64(col * kh + i)] = words[np.uint64(src + col)]
                if whole:
                    dst = y.ctypes.data + (n * p_ + oh * ow_) * co_
                    qgemm_requant(xr.ctypes.data, lda, wp.ctypes.data, dst, co_, ow_, kg, panels,
                                  layout, bias.ctypes.data, scale.ctypes.data,
                                  params.ctypes.data, co_)  # fmt: skip
                    continue
                qgemm_requant(xr.ctypes.data, lda, wp.ctypes.data, t8.ctypes.data, ncols, ow_,
                              kg, panels, layout, bias.ctypes.data, scale.ctypes.data,
                              params.ctypes.data, ncols)  # fmt: skip
                for ow in range(ow_):
                    base = np.uint64(ow * ncols)
                    if nhwc:
                        yrow = y[n, oh * ow_ + ow]
                        for q in range(co_):
                            yrow[np.uint64(q)] = t8[base + np.uint64(q)]
                    else:
                        yo = np.uint64(oh * ow_ + ow)
                        for q in range(co_):
                            y[n, q, yo] = t8[base + np.uint64(q)]


def _warm(fn: Any) -> None:
    built = qgemm_packed.available()
    if built is None:
        return
    shape = built.tile
    wp = pack_rows(np.ones((2, 3, 3, 3), np.int64), shape)
    adt = qgemm_packed.a_dtype(shape)
    params = np.array([0, 255, 0], np.float32)
    bias, scale = np.zeros(shape.nr, np.int32), np.ones(shape.nr, np.float32)
    for flags in (0, 1, 5):
        geo = np.array([3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 4, 4, flags], np.int64)
        for xdt in (np.uint8, np.int8):
            for ydt in (np.uint8, np.int8):
                x = np.ones((1, 16, 3) if flags == 1 else (1, 3, 16), xdt)
                y = np.empty((1, 4, 2) if flags else (1, 2, 4), ydt)
                xp = np.empty(6 * 6 * CP, adt)
                fn(x, xp, staged_words(xp), 0, 0, geo, 2, wp, qgemm_packed.layout_code(shape),
                   bias, scale, params, shape.vw, y)  # fmt: skip


def staged_words(xp: np.ndarray) -> np.ndarray:
    """The staged image ``xp`` (A's codes) as one word a pixel of ``CP`` codes."""
    return xp.view(np.uint32 if xp.itemsize == 1 else np.uint64)


def _prepare(module_globals: dict[str, Any]) -> bool:
    fused = qgemm_packed.kernel_requant()
    module_globals["qgemm_requant"] = fused
    return fused is not None


_QCONV_ROWS = Jitted(_qconv_rows, _warm, parallel=True, prepare=_prepare)


def kernel() -> Any:
    """The compiled loop (``_qconv_rows``), or None where numba or the kernel is off."""
    return _QCONV_ROWS.get()
