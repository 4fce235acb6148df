"""One-group float32 2-D convolutions as pixel rows times the filters packed once, the
product reading each pixel's taps in place (``kernels/lib/gemm_indirect``): ResNet's 3x3
convs at every stage, its 7x7/2 stem, SqueezeNet's 3x3 fire modules, strided convs.

``conv_cols`` puts the pixels in the kernel's vectors and the filters in its broadcasts;
over a 7x7 plane its stride-1 form computes 9-wide extended rows (63 columns for 49
pixels) and rounds them up to whole 32-column panels (64), and at every size it copies its
extended output again to crop it. Here the filters are the vectors -- whole panels of them,
no waste where the filters fill their panels -- and the pixels the rows, in two ``prange``
loops of one compiled call on numba's threads:

1. the image, channels last and zero-padded (``xt``: (N, Hp, Wp, C)), by
   ``gemm_indirect``'s copy (8 channels x 16 pixels a block, transposed in registers:
   64x56x56 38 µs where a compiled loop took 90);
2. the indirect product (``gemm_indirect``'s 8 x 32 tile on AVX-512, 6 x 16 on AVX2): row
   r of the im2row matrix is read from ``xt`` at ``rowoff[r] + toff[tap]`` (a tap's C
   channels one run, or a filter row's KW*C where its columns are undilated:
   ``_tap_offsets``), never copied; the filters packed in (tap, channel) order. Each part
   (a span of panels, or of rows) is finished by its own thread: on AVX-512 the kernel
   stores NCHW itself, ``act((v + b) + res)`` with ReLU and Clip applied before its
   store; elsewhere it stores rows into ``yt`` (N*P, M rounded up to panels) and
   ``_finish`` puts them back; any other activation then runs over each filter's run of
   pixels (``_act_row``).

One Zen 4 thread (2026-12-05, AVX-512), the conv alone / its product alone: ResNet-18's
64x56x56 3x3 2093 / 1994 µs (``conv_cols`` 2167, im2row and ``_finish`` before this
kernel 2340), 256x14x14 2023 / 1983 (with the copied im2row 2297), 512x7x7 2125 / 2049,
128x28x28 3x3/2 -> 256 1043 / 992 (1267); the copy into ``xt`` is most of the rest (40
µs at 56x56). ``conv_blocked`` routes here where K = C*KH*KW is at least ``MIN_K`` and
an image has at most ``FEW_PIXELS`` output pixels or its filters fill
``MIN_FILTER_SHARE`` of their panels (ResNet-18, in one process against ``conv_cols`` for
the planes past 256 pixels: 35.3 -> 35.0 ms at batch 1, AVX2's tile forced 39.7 -> 38.4);
a 1x1 conv only over at most ``POINTWISE_PIXELS`` pixels, of ``POINTWISE_PANELS`` panels
of filters or more, where they fill more of their panels than its pixels would fill
``conv_cols``' (``pointwise_pays``: MobileNetV2's 7x7 and 14x14 1x1 convs into many
filters; the model 1.25x -> 1.19x onnxruntime on one Zen 4 thread, EfficientNet-B0 1.26x ->
1.18x, MobileNetV3-small even). ``plan`` returns None (the caller keeps its routes) without the
kernel or numba, for shapes outside those, and where one image's buffers pass
``MAX_IMAGE_FLOATS``. A batch runs in chunks of images, one call each, whose rows times K
stay under ``CHUNK_TAP_FLOATS``. Sums run over K in (tap, channel) order with fused
multiply-adds: results agree with the other routes to float32 rounding. Thread-safe:
plans are immutable; buffers are the calling thread's scratch slots 0 and 2 (2 one row
where the kernel stores NCHW).
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np

from ..common import scratch
from ..lib import gemm_indirect, gemm_packed
from ..lib.activations import PARAMS_LEN, _act_row
from ..lib.gemm_indirect import FLAG_BIAS, FLAG_CLIP, FLAG_NCHW, FLAG_RELU, FLAG_RESIDUAL
from ..lib.gemm_packed import TileShape
from ..lib.jit import CONTRACT, Jitted, frozen, inline

__all__ = ["FEW_PIXELS", "MIN_FILTER_SHARE", "MIN_K", "PackedConvPlan", "pack_filters",
           "plan", "run"]  # fmt: skip

#: Output pixels per image up to which the route serves any filter count (16x16) ...
FEW_PIXELS = 256
#: ... and past which where real filters fill at least this share of the panels' columns
#: (filters are the kernel's vectors, rounded up to whole panels; ``conv_cols``, with the
#: pixels in the vectors, wastes none of them).
MIN_FILTER_SHARE = 0.875
#: 1x1 convs take the route up to this many output pixels an image (``conv_cols`` puts
#: the pixels in its vectors: 49 round up to 64) where the filters fill more of their
#: panels than the pixels fill theirs (``pointwise_pays``).
POINTWISE_PIXELS = 256
#: ... and at least this many panels of filters: with fewer the copy into ``xt`` and the
#: stores cost more than the panels save (one Zen 4 thread, alternating, µs, this route /
#: ``conv_cols``: 384 -> 64 at 14x14 118 / 104, 384 -> 96 at 14x14 165 / 153, 288 -> 96 at
#: 7x7 41 / 40; 160 -> 960 at 7x7 172 here, 263-287 in MobileNetV2 on ``conv_cols``).
POINTWISE_PANELS = 4
#: K = C*KH*KW at least (stems with 3 channels keep their own routes).
MIN_K = 64
#: The most floats of one image's -- and one chunk's -- padded input (``xt``, slot 0) and,
#: where the kernel stores rows, of its product rows (``yt``, slot 2): 16 MB each.
MAX_IMAGE_FLOATS = 4 << 20
#: A batch runs in chunks of images whose rows times K (the taps the product reads) stay
#: under this many floats, one image where one passes it. Measured with the im2row this
#: route had before ``gemm_indirect`` (ResNet-18 at a batch of 32, one Zen 4 thread, µs an
#: image, 512x7x7 3x3 / 256x14x14 3x3 / 128x28x28 3x3/2 -> 256): chunks of at most 1M
#: floats 2173-2210 / 2223-2255 / 1199-1229; of 4M 2253 / 2407 / 1375; the whole batch in
#: one call 2228 / 2445 / 1361.
CHUNK_TAP_FLOATS = 1 << 20

numba: Any = None  # set by Jitted(parallel=True)
_sgemm_indirect: Any = None  # set by _prepare (gemm_indirect.register)
_nhwc_pad: Any = None  # likewise
_rows_nchw: Any = None  # likewise


def _packed_conv(  # pragma: no cover - numba only
    x: Any, xt: Any, wp: Any, yt: Any, y3: Any, b: Any, res3: Any, geo: Any, pad_rows: Any,
    rowoff: Any, toff: Any, yoff: Any, nchw: int, parts: Any, act: int, p: Any, lohi: Any,
    zb: Any,
) -> None:  # fmt: skip
    """The two passes (module doc). ``geo``: kh, kw, sh, sw, dh, dw, pad top, pad left,
    oh, ow; ``pad_rows`` (image, first padded row, end), each copied by
    ``gemm_indirect``'s ``SYMBOL_NHWC``; ``rowoff``/``toff``: each output pixel's first tap
    in ``xt`` and the taps' offsets from it; ``yoff``: each output pixel's place in
    ``y3``'s plane of filter 0, where ``nchw`` (``FLAG_NCHW`` or 0) has the kernel store
    there; ``parts`` (first row, end, first panel, end panel), each finished by its thread
    (``_finish`` where the kernel stored rows); ``zb`` zeros, a row of ``yt`` long (the
    kernel's unused bias)."""
    u = np.uint64
    _n_img, c_, h_, w_ = x.shape
    hp, wpd = xt.shape[1], xt.shape[2]
    pt, pl, npx = geo[6], geo[7], geo[8] * geo[9]
    np_ = yt.shape[1]
    nr = wp.shape[2]
    k_all = geo[0] * geo[1] * c_
    k_tap = k_all // toff.shape[0]  # a tap's run: C, or a filter row's KW*C
    four, eight = u(4), u(8)
    for q in numba.prange(pad_rows.shape[0]):
        i = pad_rows[q, 0]
        _nhwc_pad(x.ctypes.data + u(i * c_ * h_ * w_) * four, c_, h_, w_,
                  xt.ctypes.data + u(i * hp * wpd * c_) * four, hp, wpd, pt, pl, pad_rows[q, 1],
                  pad_rows[q, 2], 1)  # fmt: skip
    m = y3.shape[1]
    rest = act if act > 2 else 0
    # the kernel stores NCHW itself (``nchw`` bits, ``FLAG_NCHW`` among them), else rows
    # into ``yt`` that ``_finish`` puts back
    flags = nchw
    if nchw != 0:
        flags |= FLAG_RELU if act == 1 else FLAG_CLIP if act == 2 else 0
        flags |= (FLAG_BIAS if b.shape[0] > 0 else 0) | (FLAG_RESIDUAL if res3.shape[0] > 0 else 0)
    bp = b.ctypes.data if b.shape[0] > 0 else zb.ctypes.data
    rp = res3.ctypes.data if res3.shape[0] > 0 else y3.ctypes.data
    for q in numba.prange(parts.shape[0]):
        r0, r1, p0, p1 = parts[q, 0], parts[q, 1], parts[q, 2], parts[q, 3]
        f0 = p0 * nr
        at_x, at_w = rowoff.ctypes.data + u(r0) * eight, wp.ctypes.data + u(p0 * k_all * nr) * four
        if nchw == 0:
            _sgemm_indirect(xt.ctypes.data, at_x, toff.shape[0], toff.ctypes.data, k_tap, at_w,
                            k_all, yt.ctypes.data + u(r0 * np_ + f0) * four, np_, r1 - r0,
                            p1 - p0, zb.ctypes.data, 0, nr, yoff.ctypes.data, 0, 0,
                            zb.ctypes.data, lohi.ctypes.data)  # fmt: skip
            _finish(yt, y3, b, res3, r0, r1, f0, min(m, p1 * nr), act, p, lohi)
            continue
        at_y = u(f0 * npx) * four
        _sgemm_indirect(xt.ctypes.data, at_x, toff.shape[0], toff.ctypes.data, k_tap, at_w, k_all,
                        y3.ctypes.data + at_y, 0, r1 - r0, p1 - p0, bp + u(f0) * four, flags, nr,
                        yoff.ctypes.data + u(r0) * eight, npx, m - f0, rp + at_y,
                        lohi.ctypes.data)  # fmt: skip
        if rest != 0:
            _rest_act(y3, r0, r1, f0, min(m, p1 * nr), rest, p)


def _tap_offsets(kh: int, kw: int, dh: int, dw: int, wp: int, c: int) -> np.ndarray:
    """The kernel's taps' offsets in ``xt`` (rows ``wp`` pixels of ``c`` channels) from a
    pixel's first: undilated columns (``dw`` 1) make a filter row's KW taps one run of KW*C
    floats, so a tap is a filter row (ResNet's 7x7/2 stem over 3 channels: 49 taps of 3 ->
    7 of 21, 1557 -> 1180 µs, one Intel AVX-512 thread; 3x3 convs of 64+ channels the
    same); else each (row, column) is one. Both keep the filters' (tap, channel) order."""
    if dw == 1:
        return np.array([i * dh * wp * c for i in range(kh)], np.int64)
    return np.array([(i * dh * wp + j * dw) * c for i in range(kh) for j in range(kw)],
                    np.int64)  # fmt: skip


@inline
def _finish(  # pragma: no cover - numba only
    yt: Any, y3: Any, b: Any, res3: Any, r0: int, r1: int, f0: int, f1: int, act: int, p: Any,
    lohi: Any,
) -> None:  # fmt: skip
    """Rows ``[r0, r1)`` (image-major pixels) of filters ``[f0, f1)`` of ``yt`` into ``y3``
    (N, M, P): ``act((v + b) + res)``, ReLU and Clip in the same pass (NaN kept, as
    ``_act_row``), any other activation over each filter's run of pixels after. Each
    image's rows by ``gemm_indirect``'s ``SYMBOL_ROWS_NCHW`` (8 pixels x 16 filters
    transposed in registers; a scalar loop here took ~3 ns an element on Zen 3: 96x14x14
    -> 576 spent 370 µs here against 259 in its product)."""
    u = np.uint64
    m, npx = y3.shape[1], y3.shape[2]
    np_ = yt.shape[1]
    inf = p[6]
    lo, hi = (p[2], inf) if act == 1 else (lohi[0], lohi[1]) if act == 2 else (-inf, inf)
    rest = act if act > 2 else 0
    flags = (FLAG_BIAS if b.shape[0] > 0 else 0) | (FLAG_RESIDUAL if res3.shape[0] > 0 else 0)
    four = u(4)
    bp = b.ctypes.data if b.shape[0] > 0 else yt.ctypes.data
    for i in range(r0 // npx, (r1 - 1) // npx + 1):
        x0, x1 = max(r0, i * npx) - i * npx, min(r1, (i + 1) * npx) - i * npx
        at_y = u((i * m + f0) * npx + x0) * four
        rp = res3.ctypes.data + at_y if res3.shape[0] > 0 else y3.ctypes.data + at_y
        _rows_nchw(yt.ctypes.data + u((i * npx + x0) * np_ + f0) * four, np_,
                   y3.ctypes.data + at_y, npx, x1 - x0, f1 - f0, bp + u(f0) * four, rp,
                   np.float32(lo), np.float32(hi), flags)  # fmt: skip
    if rest != 0:
        _rest_act(y3, r0, r1, f0, f1, rest, p)


@inline
def _rest_act(  # pragma: no cover - numba only
    y3: Any, r0: int, r1: int, f0: int, f1: int, rest: int, p: Any
) -> None:  # fmt: skip
    """The activation ``rest`` (a compiled code past ReLU and Clip) over rows ``[r0, r1)``
    (image-major pixels) of filters ``[f0, f1)`` of ``y3`` (N, M, P), each filter's run."""
    npx = y3.shape[2]
    for i in range(r0 // npx, (r1 - 1) // npx + 1):
        x0, x1 = max(r0, i * npx) - i * npx, min(r1, (i + 1) * npx) - i * npx
        for f in range(f0, f1):
            _act_row(y3[i, f, x0:x1], -p[2], rest, p)


def _warm(fn: Any) -> None:
    t, nr = np.float32, (gemm_packed.tile() or gemm_packed.P16).nr
    geo = np.array([1, 1, 1, 1, 1, 1, 0, 0, 1, 2], np.int64)
    x, xt = np.ones((1, 2, 1, 2), t), np.zeros((1, 1, 2, 2), t)
    # the packed filters and the bias read-only, as a model's (pack_filters, initializers)
    wp, yt, y3 = frozen(np.ones((1, 2, nr), t)), np.zeros((2, nr), t), np.zeros((1, 3, 2), t)
    one = np.array([[0, 0, 1]], np.int64)
    fn(x, xt, wp, yt, y3, frozen(np.zeros(3, t)), np.zeros((0, 0, 0), t), geo, one,
       frozen(np.array([0, 2], np.int64)), frozen(np.zeros(1, np.int64)),
       frozen(np.array([0, 1], np.int64)), FLAG_NCHW if gemm_indirect.nchw_stores() else 0,
       np.array([[0, 2, 0, 1]], np.int64), 1, np.zeros(PARAMS_LEN, t), np.zeros(2, t),
       np.zeros(nr, t))  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    # False: no numba, or a host the kernel does not run on
    return gemm_indirect.register(module_globals)


PACKED_CONV = Jitted(_packed_conv, _warm, helpers=(_act_row, _rest_act, _finish), fastmath=CONTRACT,
                     parallel=True, prepare=_prepare)  # fmt: skip


class PackedConvPlan(NamedTuple):
    """How ``run`` computes one input shape (immutable)."""

    fn: Any  # PACKED_CONV's compiled function
    geo: np.ndarray  # kh, kw, sh, sw, dh, dw, pad top, pad left, oh, ow
    xt_shape: tuple[int, int, int, int]  # (N, Hp, Wp, C)
    yt_shape: tuple[int, int]  # (N*P, panels * nr); one row where the kernel stores NCHW
    pad_rows: np.ndarray
    rowoff: np.ndarray  # (N*P,) int64: each output pixel's first tap in xt
    toff: np.ndarray  # int64: each tap's offset from it (``_tap_offsets``)
    yoff: np.ndarray  # (N*P,) int64: each output pixel's place in y3's plane of filter 0
    nchw: int  # FLAG_NCHW where the kernel stores y3 itself, 0: rows into yt, then _finish
    parts: np.ndarray
    act: int  # 1 ReLU, 2 Clip, other compiled codes after, 0 none
    lohi: np.ndarray  # Clip's bounds (float32)
    zeros: np.ndarray  # a row of ``yt`` of zeros
    # the plan of the batch's last chunk where it has fewer images than ``xt_shape[0]``
    # (the images a call takes); None: every chunk is whole
    last: PackedConvPlan | None = None


def serves(k: int, m: int, pixels: int, shape: TileShape) -> bool:
    """Whether a one-group conv of K = C*KH*KW ``k`` and ``m`` filters over ``pixels``
    output pixels an image is one this route computes with the kernel of ``shape``: K at
    least ``MIN_K``, and at most ``FEW_PIXELS`` pixels or filters that fill
    ``MIN_FILTER_SHARE`` of their panels."""
    padded = -(-m // shape.nr) * shape.nr
    return k >= MIN_K and (pixels <= FEW_PIXELS or m >= MIN_FILTER_SHARE * padded)


def padded_plane(
    x_shape: tuple[int, ...], kernel: tuple[int, int], out_shape: tuple[int, ...],
    strides: tuple[int, ...], pads_begin: tuple[int, ...], dilations: tuple[int, ...],
) -> tuple[int, int]:  # fmt: skip
    """(Hp, Wp): the padded image's plane ``xt`` holds (the taps the outputs read)."""
    (h, w), (kh, kw), (oh, ow) = x_shape[2:], kernel, out_shape[2:]
    (sh, sw), (dh, dw) = strides, dilations
    return (max(h + pads_begin[0], (oh - 1) * sh + (kh - 1) * dh + 1),
            max(w + pads_begin[1], (ow - 1) * sw + (kw - 1) * dw + 1))  # fmt: skip


def chunk_images(n: int, xt_floats: int, rows_floats: int, taps_floats: int) -> int:
    """The images of ``n`` a kernel call takes: its rows times K (``taps_floats`` an
    image) under ``CHUNK_TAP_FLOATS``, its buffers (``xt_floats``, and ``rows_floats``
    of product rows where the kernel stores rows) under ``MAX_IMAGE_FLOATS`` (a strided
    conv over a big input reads few taps from a big ``xt``); 0 where one image's pass
    it."""
    per_image = max(xt_floats, rows_floats)
    if per_image > MAX_IMAGE_FLOATS:
        return 0
    return min(n, max(1, CHUNK_TAP_FLOATS // taps_floats), MAX_IMAGE_FLOATS // per_image)


def offsets(
    n: int, c: int, m: int, plane: tuple[int, int], kernel: tuple[int, int],
    out_hw: tuple[int, int], strides: tuple[int, ...], dilations: tuple[int, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(rowoff, toff, yoff) of ``n`` images (``_packed_conv``'s): each output pixel's first
    tap in ``xt`` (``plane`` (Hp, Wp) of ``c`` channels an image), the taps' offsets from
    it (``_tap_offsets``), each pixel's place in the output's plane of filter 0 (``m``
    planes of OH*OW an image); int64."""
    (hp, wp), (kh, kw), (oh, ow) = plane, kernel, out_hw
    (sh, sw), (dh, dw) = strides, dilations
    oy, ox = np.divmod(np.arange(oh * ow, dtype=np.int64), ow)
    first = (oy * sh * wp + ox * sw) * c  # an image's pixels' first taps
    images = np.arange(n, dtype=np.int64)[:, None]
    rowoff = (images * (hp * wp * c) + first).reshape(-1)
    yoff = (images * (m * oh * ow) + np.arange(oh * ow, dtype=np.int64)).reshape(-1)
    return rowoff, _tap_offsets(kh, kw, dh, dw, wp, c), yoff


def pointwise_pays(m: int, pixels: int, shape: TileShape | None = None) -> bool:
    """Whether a 1x1 conv of ``m`` filters over ``pixels`` output pixels an image takes
    this route: few pixels (``POINTWISE_PIXELS``), ``POINTWISE_PANELS`` panels of filters
    or more, and the filters fill more of this kernel's panels than the pixels would fill
    ``conv_cols``' (both vectors of the kernel's panel width); ``shape``: this process's
    tile (``gemm_packed.tile()``) unless given."""
    shape = shape or gemm_packed.tile()
    if shape is None or pixels > POINTWISE_PIXELS or m < POINTWISE_PANELS * shape.nr:
        return False
    nr = shape.nr
    return m / (-(-m // nr) * nr) > pixels / (-(-pixels // nr) * nr)


def pack_filters(w: np.ndarray, shape: TileShape | None = None) -> np.ndarray | None:
    """Filters (M, C, KH, KW) as the kernel's panels of (tap, channel) rows, M rounded up to
    the panel width by zero filters; None without the packed kernel. ``shape``: this
    process's tile unless given."""
    shape = shape or gemm_packed.tile()
    if shape is None:
        return None
    m = w.shape[0]
    k_rows = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(-1, m), dtype=np.float32)
    pad = -m % shape.nr
    if pad:
        k_rows = np.concatenate([k_rows, np.zeros((k_rows.shape[0], pad), np.float32)], axis=1)
    packed = gemm_packed.pack(k_rows, shape)
    packed.flags.writeable = False
    return packed


def _spans(total: int, parts: int, step: int = 1) -> list[tuple[int, int]]:
    """``total`` cut into at most ``parts`` spans at multiples of ``step``."""
    units = -(-total // step)
    cuts = sorted({min(total, step * (units * j // parts)) for j in range(parts + 1)} | {total})
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def plan(
    x_shape: tuple[int, ...], m: int, kernel: tuple[int, int], out_shape: tuple[int, ...],
    strides: tuple[int, ...], pads_begin: tuple[int, ...], dilations: tuple[int, ...],
    act: int, params: np.ndarray, threads: int,
) -> PackedConvPlan | None:  # fmt: skip
    """The plan of a one-group float32 conv (as ``conv_cols.plan``'s arguments) on this
    route, or None where it does not serve: no indirect kernel or numba, more than
    ``FEW_PIXELS`` output pixels an image with filters under ``MIN_FILTER_SHARE`` of the
    panels, K under ``MIN_K``, one image's buffers over ``MAX_IMAGE_FLOATS``, negative
    pads. A batch whose rows times K pass ``CHUNK_TAP_FLOATS`` is planned in chunks of
    images (``PackedConvPlan.last`` for a shorter last one)."""
    n, c = x_shape[:2]
    kh, kw = kernel
    oh, ow = out_shape[2], out_shape[3]
    if c * kh * kw < MIN_K or min(pads_begin) < 0 or not gemm_indirect.available():
        return None
    shape = gemm_packed.tile()
    if shape is None or not serves(c * kh * kw, m, oh * ow, shape):
        return None
    padded = -(-m // shape.nr) * shape.nr
    hp, wp = padded_plane(x_shape, kernel, out_shape, strides, pads_begin, dilations)
    (sh, sw), (dh, dw) = strides, dilations
    rows_out = 0 if gemm_indirect.nchw_stores() else oh * ow * padded
    chunk = chunk_images(n, hp * wp * c, rows_out, oh * ow * c * kh * kw)
    if chunk == 0:
        return None
    if chunk < n:
        whole = plan((chunk, *x_shape[1:]), m, kernel, (chunk, *out_shape[1:]), strides,
                     pads_begin, dilations, act, params, threads)  # fmt: skip
        rest = n % chunk
        if whole is None or rest == 0:
            return whole
        last = plan((rest, *x_shape[1:]), m, kernel, (rest, *out_shape[1:]), strides,
                    pads_begin, dilations, act, params, threads)  # fmt: skip
        return None if last is None else whole._replace(last=last)
    fn = PACKED_CONV.get()
    if fn is None:
        return None
    rows = n * oh * ow
    panels = -(-m // shape.nr)
    t = max(1, threads)
    pad_rows = [(i, a, b) for i in range(n) for a, b in _spans(hp, t)]
    rowoff, toff, yoff = offsets(n, c, m, (hp, wp), kernel, (oh, ow), strides, dilations)
    nchw = FLAG_NCHW if gemm_indirect.nchw_stores() else 0
    # each part reads all of one operand and its share of the other: share the bigger
    by_panels = panels >= t and (panels * shape.nr >= rows or rows < 2 * t * shape.mr)
    if by_panels:
        parts = [(0, rows, a, b) for a, b in _spans(panels, t)]
    else:
        parts = [(a, b, 0, panels) for a, b in _spans(rows, t, shape.mr)]
    geo = np.array([kh, kw, sh, sw, dh, dw, pads_begin[0], pads_begin[1], oh, ow], np.int64)
    lohi = np.array([params[0], params[1]], np.float32)
    arr = lambda v: np.array(v, np.int64)  # noqa: E731
    yt_rows = 1 if nchw else rows  # the kernel's NCHW stores leave yt unused
    return PackedConvPlan(fn, geo, (n, hp, wp, c), (yt_rows, panels * shape.nr), arr(pad_rows),
                          frozen(rowoff), frozen(toff), frozen(yoff), nchw, arr(parts), act, lohi,
                          np.zeros(panels * shape.nr, np.float32))  # fmt: skip


def run(
    pp: PackedConvPlan,
    x: np.ndarray,
    wp: np.ndarray,
    y3: np.ndarray,
    b: np.ndarray,
    res3: np.ndarray | None,
    params: np.ndarray,
) -> None:
    """``y3`` (N, M, OH*OW) = act(conv(``x``) + ``b`` + ``res3``), ``x`` C-contiguous float32
    (N, C, H, W), ``wp`` from ``pack_filters``, ``b`` (M,) or empty, a call per chunk of
    images (``plan``). The caller has entered numba's threads (``native_threads.enter``)."""
    step = pp.xt_shape[0]
    for i in range(0, x.shape[0], step):
        j = min(x.shape[0], i + step)
        sub = pp if j - i == step else pp.last
        if sub is None:  # a plan of another batch (never: plans are per input shape)
            raise RuntimeError(f"no packed conv plan for a chunk of {j - i} images")
        _run_chunk(sub, x[i:j], wp, y3[i:j], b, None if res3 is None else res3[i:j], params)


def _run_chunk(pp: PackedConvPlan, x: np.ndarray, wp: np.ndarray, y3: np.ndarray, b: np.ndarray,
               res3: np.ndarray | None, params: np.ndarray) -> None:  # fmt: skip
    """``run`` on the images one call takes (``pp.xt_shape[0]``)."""
    xt = scratch(0, pp.xt_shape, x.dtype)
    yt = scratch(2, pp.yt_shape, x.dtype)
    pp.fn(x, xt, wp, yt, y3, b, _EMPTY3 if res3 is None else res3, pp.geo, pp.pad_rows,
          pp.rowoff, pp.toff, pp.yoff, pp.nchw, pp.parts, pp.act, params, pp.lohi,
          pp.zeros)  # fmt: skip


_EMPTY3 = np.zeros((0, 0, 0), np.float32)
