"""QLinearConv on integers: a 2-D, ungrouped quantized convolution with constant weights
on ``lib.qgemm_packed``'s exact u8 x s8 kernel, requantized as it is stored.

Per image: the input is staged channels-last (``xt[h * W + w, c]``, int8 codes shifted by
128 to unsigned, in the kernel's A type), then the output pixels go in blocks of rows
(and, when there are few, of weight panels too) over numba's native threads; per block:
its im2row (``a[r, (i * KW + j) * C + c]``: a tap's channels are one contiguous run of
the staged row; the input's zero point in the padding), one kernel call for the block's
int32 sums, then the requantize into the NCHW output while they are in cache:
``y = saturate(rint(float32(acc + bias') * scale[co]) + y_zp)`` with
``bias' = B - x_zp * colsum(w)`` (and ``- w_zp[co] * rowsum(a) + K * x_zp * w_zp[co]``
for weights with a zero point) folded at load, float32 arithmetic as MLAS's requantize.
On an ``avx2`` path, symmetric weights that ``qgemm_packed.pairs_exact`` proves cannot
saturate ``vpmaddubsw`` (7-bit ones: onnxruntime's ``reduce_range``) are packed for
``pairs256``: the codes stay bytes (a 1x1 conv reads uint8 channels-last input in place).

``plan(...)`` makes the load-time part (None where the kernel or numba is missing, or the
conv is outside this form: grouped, not 2-D, a sum that could leave int32); ``QConvPlan.run``
is called per image batch from any thread: each call's buffers are its own.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..common import ShapeMemo
from ..lib import qgemm_packed
from ..lib.jit import Jitted
from . import conv_qrows

__all__ = ["QConvPlan", "plan"]

numba: Any = None  # set by Jitted(parallel=True) before the loop below compiles
qgemm_kernel: Any = None  # the ExternalFunctions, set by _prepare
qgemm_requant: Any = None

#: the output rows (pixels) of one block: its im2row and int32 sums stay in L2
_BLOCK_BYTES = 96 * 1024
#: weights of at least this many bytes (beyond half a core's L2) are read once per call,
#: not once per block of rows, when the whole im2row is at most ``_WIDE_ROWS_CODES`` codes:
#: ResNet's last stage (7x7 pixels, 3x3x512 -> 512: 2.4 MB of weights) ran 168 -> 136 µs
#: on two Zen 5 threads that way (blocks of 16 rows read the weights four times). Codes,
#: not bytes: the ``avx2`` path's are int16 pairs (the same conv's 451 KB im2row), where
#: seven blocks ran 1536 µs and one 1511 (Zen 3, two threads, medians of 7 x 50 calls)
_WIDE_WEIGHT_BYTES = 1 << 20
_WIDE_ROWS_CODES = 256 * 1024
#: input shapes a plan keeps the per-shape part of its calls for (``ShapeMemo``)
_CALLS_MAX = 64
#: the largest reduction whose u8 x s8 sums certainly fit in int32
_MAX_K = (2**31 - 1) // (255 * 128)


class QConvPlan(NamedTuple):
    """The load-time half of an integer QLinearConv. Immutable."""

    packed: np.ndarray  # weights (KH*KW*C x Co, tap-major) in the kernel's panels
    bias: np.ndarray  # int32 per output channel (zero past Co), the zero-point terms folded in
    scale: np.ndarray  # float32 per output channel (zero past Co): x_scale * w_scale / y_scale
    wzp: np.ndarray  # int32 per output channel (zero: symmetric weights)
    x_shift: int  # 128 for int8 inputs (made unsigned), 0 for uint8
    x_zp: int  # the input's zero point after the shift
    y_zp: float
    lo: float
    hi: float
    y_dtype: np.dtype
    geo: np.ndarray  # int64: kh, kw, sh, sw, dh, dw, pad top, pad left, pad bottom, pad right
    channels: int
    layout: int
    a_dtype: np.dtype
    kernel: Any
    params: np.ndarray  # float32 [lo - y_zp, hi - y_zp, y_zp]: the fused requantize's
    vw: int  # the kernel's vector width (a fused store writes whole vectors)

    calls: ShapeMemo[tuple[Any, ...], _Call]  # per (input shape, layout): ``_layout``'s
    #: the weights for ``conv_qrows`` (few input channels, symmetric), or None (im2row)
    rows_packed: np.ndarray | None = None
    rows_kernel: Any = None

    def run(self, x: np.ndarray, channels_last: bool = False) -> np.ndarray | None:
        """y for ``x`` (N, C, H, W), or (N, H, W, C) -> (N, OH, OW, Co) with
        ``channels_last``; None when ``x`` does not fit the plan (the caller then runs the
        exact float path)."""
        if x.dtype != (np.int8 if self.x_shift == 128 else np.uint8):
            return None
        lay = self.calls.made((x.shape, channels_last), _layout, self, x.shape, channels_last)
        if lay is None:
            return None
        y = np.empty(lay.y_shape, self.y_dtype)
        if lay.rows is None:
            return y
        threads = native_threads.enter_for(lay.work, intra_pool().threads)
        if self.rows_packed is not None:
            self._run_rows(x, channels_last, lay, y)
            return y
        # few row blocks: the panels split too (each part repeats its blocks' im2row)
        nrb, panels = lay.row_blocks, self.packed.shape[0]
        ncol = 1 if nrb >= 2 * threads else max(1, min(panels, -(-2 * threads // nrb)))
        self.kernel(np.ascontiguousarray(x).reshape(lay.xs_shape),
                    np.empty(lay.xt_len, self.a_dtype), self.x_shift, self.x_zp, lay.geo,
                    lay.ow, self.packed, self.layout, self.bias, self.scale, self.wzp,
                    self.y_zp, self.lo, self.hi, lay.rb, ncol, self.params, self.vw,
                    y.reshape(lay.rows))  # fmt: skip
        return y

    def _run_rows(self, x: np.ndarray, channels_last: bool, lay: _Call, y: np.ndarray) -> None:
        """``conv_qrows``' form into ``y``. A channels-last view of planes (the layout
        pass's Transpose of a model's input) is read as the planes it is: no copy."""
        xp = np.empty(lay.staged_len, self.a_dtype)
        geo = lay.geo
        planes = x.transpose(0, 3, 1, 2) if channels_last else x
        if channels_last and not x.flags.c_contiguous and planes.flags.c_contiguous:
            xs, geo = planes.reshape(x.shape[0], x.shape[3], -1), lay.geo_planar
        else:
            xs = np.ascontiguousarray(x).reshape(lay.xs_shape)
        self.rows_kernel(xs, xp, conv_qrows.staged_words(xp), self.x_shift, self.x_zp, geo,
                         lay.ow, self.rows_packed, self.layout, self.bias, self.scale,
                         self.params, self.vw, y.reshape(lay.rows))  # fmt: skip


class _Call(NamedTuple):
    """What ``QConvPlan.run`` computes from an input shape, made once per shape."""

    y_shape: tuple[int, ...]
    rows: tuple[int, ...] | None  # the output as the kernel writes it (None: no images)
    xs_shape: tuple[int, ...]  # the input as the kernel reads it
    xt_len: int  # the staging buffer's elements
    geo: np.ndarray  # the plan's geometry, then h, w and the flags
    geo_planar: np.ndarray  # the same, flagged for a channels-last view of planes
    staged_len: int  # ``conv_qrows``' padded 4-channel image: its codes
    ow: int
    rb: int  # output rows a block
    row_blocks: int
    work: int  # multiply-adds: how many threads


def _layout(p: QConvPlan, shape: tuple[int, ...], channels_last: bool) -> _Call | None:
    """``run``'s per-shape part for ``p`` (None: the input does not fit the plan)."""
    if len(shape) != 4 or shape[3 if channels_last else 1] != p.channels:
        return None
    kh, kw, sh, sw, dh, dw, pt, pl, pb, pr = (int(v) for v in p.geo)
    n, h, w, c = shape if channels_last else (shape[0], *shape[2:], shape[1])
    oh = (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (w + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    if oh <= 0 or ow <= 0:
        return None
    co = p.wzp.shape[0]
    y_shape = (n, oh, ow, co) if channels_last else (n, co, oh, ow)
    kg, g = p.packed.shape[1], p.packed.shape[3]
    q = oh * ow
    row_bytes = kg * g * p.a_dtype.itemsize  # one output pixel's im2row
    if p.packed.nbytes >= _WIDE_WEIGHT_BYTES and q * kg * g <= _WIDE_ROWS_CODES:
        rb = -(-q // 8) * 8  # one block: the weights stream once; the panels split instead
    else:
        rb = max(8, min(256, _BLOCK_BYTES // (row_bytes + co * 4)))
        rb = -(-rb // 8) * 8
    # channels-last uint8 codes are the kernel's A as they are: no staging copy
    # (a 1x1 conv reads its rows in whole groups of g: past the end of x unless C is a
    # multiple of g, so then x is staged into xt, which has the room)
    direct = channels_last and p.x_shift == 0 and p.a_dtype == np.uint8 and c % g == 0
    flags = int(channels_last) | (2 if direct else 0)
    return _Call(
        y_shape,
        ((n, q, co) if channels_last else (n, co, q)) if n else None,
        (n, h * w, c) if channels_last else (n, c, h * w),
        # (+ g: the kernel reads whole groups; the weights past K are zero)
        (1 if direct else h * w * c) + g,
        np.concatenate([p.geo, np.array([h, w, flags], np.int64)]),
        np.concatenate([p.geo, np.array([h, w, int(channels_last) | 4], np.int64)]),
        (h + pt + pb) * (w + pl + pr) * conv_qrows.CP,
        ow,
        rb,
        -(-q // rb),
        n * q * co * kg * g,
    )


def plan(
    w: np.ndarray, w_scale: Any, w_zp: Any, x_scale: Any, x_zp: Any, y_scale: Any, y_zp: Any,
    bias: Any, geo: tuple[int, ...],
) -> QConvPlan | None:  # fmt: skip
    """The plan of a QLinearConv with these constants, or None (see the module doc). The
    input's dtype is x_zp's (uint8 without one); the output's y_zp's (likewise)."""
    built = qgemm_packed.available()
    if built is None or not _QCONV.usable() or w.ndim != 4 or w.dtype not in (np.uint8, np.int8):
        return None
    co, c, kh, kw = w.shape
    k = c * kh * kw
    sizes = [np.asarray(v).size for v in (x_scale, x_zp, y_scale, y_zp) if v is not None]
    if any(s != 1 for s in sizes) or any(
        v is not None and np.asarray(v).size not in (1, co) for v in (w_scale, w_zp)
    ):
        return None
    if k > _MAX_K or co == 0 or k == 0:
        return None
    xdt = np.dtype(np.uint8) if x_zp is None else np.asarray(x_zp).dtype
    ydt = np.dtype(np.uint8) if y_zp is None else np.asarray(y_zp).dtype
    if xdt not in (np.uint8, np.int8) or ydt not in (np.uint8, np.int8):
        return None
    shape = built.tile
    # weights as signed codes: uint8 ones shifted by 128 (their zero point with them)
    wi = w.astype(np.int64)
    wz = np.zeros(co, np.int64) if w_zp is None else np.broadcast_to(
        np.asarray(w_zp).astype(np.int64).reshape(-1), (co,)).copy()  # fmt: skip
    if w.dtype == np.uint8:
        wi -= 128
        wz -= 128
    x_shift = 128 if xdt == np.int8 else 0
    zx = (0 if x_zp is None else int(np.asarray(x_zp).reshape(()))) + x_shift
    w_taps = wi.transpose(2, 3, 1, 0).reshape(k, co)  # (i, j, c) x co: the im2row order
    colsum = w_taps.sum(axis=0)
    b = np.zeros(co, np.int64) if bias is None else np.asarray(bias).astype(np.int64)
    b = b - zx * colsum + k * zx * wz
    if np.abs(b).max() >= 2**31 or np.abs(wz).max() * 255 * k >= 2**31:
        return None  # beyond int32 (the float path stays exact)
    scale = np.asarray(x_scale) * np.asarray(w_scale).reshape(-1) / np.asarray(y_scale)
    scale = np.broadcast_to(np.asarray(scale, np.float32), (co,)).copy()
    info = np.iinfo(ydt)
    zy = 0.0 if y_zp is None else float(np.asarray(y_zp).reshape(()))
    # a stem (few channels, symmetric weights, no dilation): rows read in place, no im2row
    rows_kernel = conv_qrows.kernel() if c <= conv_qrows.MAX_CHANNELS else None
    stem = rows_kernel is not None and not wz.any() and geo[4] == geo[5] == 1
    if not stem and not wz.any():  # weights no pair of which can saturate: vpmaddubsw
        shape = qgemm_packed.tile_for(w_taps, shape)
    key = (qgemm_packed.layout_code(shape), xdt, ydt)  # what the compiled types follow
    fn = _QCONV.get_for(key, functools.partial(_warm_types, shape, xdt, ydt))
    if fn is None:
        return None
    packed = qgemm_packed.pack(w_taps, shape)
    npad = packed.shape[0] * shape.nr  # bias and scale padded to whole panels: the fused
    bias_p, scale_p = np.zeros(npad, np.int32), np.zeros(npad, np.float32)  # store reads them
    bias_p[:co], scale_p[:co] = b, scale
    params = np.array([info.min - zy, info.max - zy, zy], np.float32)
    return QConvPlan(
        packed, bias_p, scale_p, wz.astype(np.int32), x_shift, zx, zy, float(info.min),
        float(info.max), ydt, np.array(geo, np.int64), c, qgemm_packed.layout_code(shape),
        qgemm_packed.a_dtype(shape), fn, params, shape.vw, ShapeMemo(_CALLS_MAX),
        conv_qrows.pack_rows(wi, shape) if stem else None, rows_kernel if stem else None,
    )  # fmt: skip


def _qconv(x, xt, x_shift, zx, geo, ow_, wp, layout, bias, scale, wzp, zy, lo, hi, rb, ncol,
           params, vw, y):  # pragma: no cover - numba only  # fmt: skip
    # geo[12] flags: 1 channels last (x (N, H*W, C), y (N, P, Co); else x (N, C, H*W), y
    # (N, Co, P)), 2 x's codes are A as they are (no staging into xt). Unsigned flat
    # indices, so that the copies and the requantize vectorize.
    h_, w_, flags = geo[10], geo[11], geo[12]
    nhwc, direct = (flags & 1) != 0, (flags & 2) != 0
    n_ = x.shape[0]
    c_ = x.shape[2] if nhwc else x.shape[1]
    kh, kw, sh, sw, dh, dw, pt, pl = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    co_, p_ = (y.shape[2], y.shape[1]) if nhwc else (y.shape[1], y.shape[2])
    panels, kg, nr, g = wp.shape
    kp = kg * g
    kk = kh * kw * c_
    esize = wp.itemsize
    nrb = (p_ + rb - 1) // rb
    pcol = (panels + ncol - 1) // ncol
    asym = False
    for q in range(co_):
        if wzp[q] != 0:
            asym = True
    # a 1x1 conv over every pixel reads its rows of A straight from the staged input
    pointwise = (
        kh == 1 and kw == 1 and sh == 1 and sw == 1 and geo[6] + geo[7] + geo[8] + geo[9] == 0
    )
    hw_ = h_ * w_
    nsb = (hw_ + 31) // 32
    uc = np.uint64(c_)
    fz = np.float32(zy)
    flo, fhi = np.float32(lo - zy), np.float32(hi - zy)
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    xflat = x.reshape(-1)
    for n in range(n_):
        src_all = xt
        base_in = np.uint64(0)
        if direct:
            src_all = xflat.view(xt.dtype)
            base_in = np.uint64(n * hw_ * c_)
        elif nhwc:
            xn = x[n].reshape(-1)
            for sb in numba.prange(nsb):
                for t in range(sb * 32 * c_, min(hw_, sb * 32 + 32) * c_):
                    xt[np.uint64(t)] = np.int32(xn[np.uint64(t)]) + x_shift
        else:
            # channels-last staging in blocks of 32 pixels: the block's rows stay in L1
            for sb in numba.prange(nsb):
                s0 = sb * 32
                s1 = min(hw_, s0 + 32)
                for c in range(c_):
                    xc = x[n, c]
                    for s in range(s0, s1):
                        xt[np.uint64(s) * uc + np.uint64(c)] = np.int32(xc[np.uint64(s)]) + x_shift
        for blk in numba.prange(nrb * ncol):
            p0 = (blk // ncol) * rb
            rows = min(rb, p_ - p0)
            pa = (blk % ncol) * pcol
            pb = min(panels, pa + pcol)
            if pa >= pb:
                continue
            if pointwise:
                a = src_all[base_in + np.uint64(p0) * uc :]
                lda = c_
            else:
                lda = kp
                a = np.empty(rows * kp + g, xt.dtype)
                for r in range(rows):
                    oh = (p0 + r) // ow_
                    ow = (p0 + r) - oh * ow_
                    ar = np.uint64(r * kp)
                    iw0 = ow * sw - pl
                    # the taps j in [j0, j1) fall inside the row: with dw == 1 they are one
                    # run of (j1 - j0) * C elements of the input, copied as one loop
                    j0 = 0 if iw0 >= 0 else min(kw, (-iw0 + dw - 1) // dw)
                    j1 = max(j0, min(kw, (w_ - 1 - iw0) // dw + 1)) if iw0 < w_ else j0
                    for i in range(kh):
                        ih = oh * sh - pt + i * dh
                        d = ar + np.uint64(i * kw * c_)
                        if ih < 0 or ih >= h_:
                            for t in range(kw * c_):
                                a[d + np.uint64(t)] = zx
                            continue
                        for t in range(j0 * c_):
                            a[d + np.uint64(t)] = zx
                        for t in range(j1 * c_, kw * c_):
                            a[d + np.uint64(t)] = zx
                        row = base_in + np.uint64(ih * w_) * uc
                        if dw == 1:
                            src = row + np.uint64(iw0 + j0) * uc
                            dj = d + np.uint64(j0 * c_)
                            for t in range((j1 - j0) * c_):
                                a[dj + np.uint64(t)] = src_all[src + np.uint64(t)]
                        else:
                            for j in range(j0, j1):
                                src = row + np.uint64(iw0 + j * dw) * uc
                                dj = d + np.uint64(j * c_)
                                for c in range(c_):
                                    a[dj + np.uint64(c)] = src_all[src + np.uint64(c)]
                    for t in range(kk, kp):
                        a[ar + np.uint64(t)] = 0
            ncols = (pb - pa) * nr
            q0, q1 = pa * nr, min(co_, pb * nr)
            nq = q1 - q0
            wpa = wp.ctypes.data + pa * kg * nr * g * esize
            if not asym:  # the kernel requantizes as it stores (symmetric weights)
                bq, sq = bias.ctypes.data + q0 * 4, scale.ctypes.data + q0 * 4
                if nhwc and co_ % vw == 0:  # straight into the output's rows
                    dst = y.ctypes.data + (n * p_ + p0) * co_ + q0
                    qgemm_requant(a.ctypes.data, lda, wpa, dst, co_, rows, kg, pb - pa, layout,
                                  bq, sq, params.ctypes.data, nq)  # fmt: skip
                    continue
                t8 = np.empty(rows * ncols, y.dtype)
                qgemm_requant(a.ctypes.data, lda, wpa, t8.ctypes.data, ncols, rows, kg, pb - pa,
                              layout, bq, sq, params.ctypes.data, ncols)  # fmt: skip
                for r in range(rows):
                    base = np.uint64(r * ncols)
                    if nhwc:
                        yrow = y[n, p0 + r]
                        for q in range(nq):
                            yrow[np.uint64(q0 + q)] = t8[base + np.uint64(q)]
                    else:
                        yo = np.uint64(p0 + r)
                        for q in range(nq):
                            y[n, q0 + q, yo] = t8[base + np.uint64(q)]
                continue
            acc = np.empty(rows * ncols, np.int32)
            qgemm_kernel(a.ctypes.data, lda, wpa, acc.ctypes.data, ncols, rows, kg, pb - pa,
                         layout)  # fmt: skip
            tmp = np.empty(nq, np.float32)
            for r in range(rows):
                rs = np.int32(0)
                for t in range(kk):
                    rs += np.int32(a[np.uint64(r * lda + t)])
                base = np.uint64(r * ncols)
                for q in range(nq):  # MLAS's order: scale, clamp, round, + zero point
                    uq = np.uint64(q)
                    qq = np.uint64(q0) + uq
                    v = np.float32(acc[base + uq] + bias[qq] - wzp[qq] * rs) * scale[qq]
                    v = min(max(v, flo), fhi)
                    tmp[uq] = ((v + magic) - magic) + fz
                if nhwc:
                    yrow = y[n, p0 + r]
                    for q in range(nq):
                        yrow[np.uint64(q0 + q)] = tmp[np.uint64(q)]
                else:
                    yo = np.uint64(p0 + r)
                    for q in range(nq):
                        y[n, q0 + q, yo] = tmp[np.uint64(q)]


def _warm_types(shape: qgemm_packed.QTile, xdt: Any, ydt: Any, fn: Any) -> None:
    """Compile the kernel for one tile and one pair of input and output types (a plan's:
    ``plan``), by a call on one 4x4 channel."""
    wp = qgemm_packed.pack(np.ones((9, 2), np.int8), shape)
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4, 0], np.int64)
    adt = qgemm_packed.a_dtype(shape)
    x = np.ones((1, 1, 16), xdt)
    y = np.empty((1, 2, 16), ydt)
    z, bias = np.zeros(2, np.int32), np.zeros(shape.nr, np.int32)
    params = np.array([0, 255, 0], np.float32)
    fn(x, np.empty(16 + shape.g, adt), 0, 0, geo, 4, wp, qgemm_packed.layout_code(shape),
       bias, np.ones(shape.nr, np.float32), z, 0.0, 0.0, 255.0, 8, 1, params, shape.vw,
       y)  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    fn, fused = qgemm_packed.kernel(), qgemm_packed.kernel_requant()
    module_globals["qgemm_kernel"], module_globals["qgemm_requant"] = fn, fused
    return fn is not None and fused is not None


#: no warm-up of its own: each plan compiles its tile and types (``get_for``)
_QCONV = Jitted(_qconv, parallel=True, prepare=_prepare)
