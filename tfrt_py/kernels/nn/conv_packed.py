"""One-group float32 2-D convolutions over few output pixels as pixel rows times the
filters packed once (``kernels/lib/gemm_packed``): ResNet's 14x14 and 7x7 stages,
SqueezeNet's 13x13 fire modules, strided convs down to those planes.

``conv_cols`` puts the pixels in the kernel's vectors and the filters in its broadcasts;
over a 7x7 plane its stride-1 form computes 9-wide extended rows (63 columns for 49
pixels) and rounds them up to whole 32-column panels (64): 77% of the work useful, and
512x7x7 3x3 ran at half the two cores' peak. Here the filters are the vectors -- a
multiple of the panel width, no waste -- and the pixels the rows, in three ``prange``
loops of one compiled call on numba's threads:

1. the image, channels last and zero-padded (``xt``: (N, Hp, Wp, C));
2. im2row (``a``: (N*P, KH*KW*C), a pixel's taps one after another, each a copied run of C
   floats from ``xt``);
3. ``a`` times the filters, packed in that (tap, channel) order (``gemm_packed``'s 8 x 32
   tile on AVX-512, 6 x 16 on AVX2), into ``yt`` (N*P, M rounded up to panels), each part
   (a span of panels, or of rows when ``a`` is the bigger operand) then put back to NCHW
   by its own thread (``_finish``): ``act((yt + b) + res)``, ReLU and Clip in the same
   pass, any other activation over each filter's run after (``_act_row``).

One Zen 5 thread (2026-12-03, AVX-512): 512x7x7 3x3 -> 512's product 949 µs at 226 GFLOP/s
(~244 peak), the other passes ~25 µs. ``conv_blocked`` routes here where an image has at
most ``FEW_PIXELS`` output pixels and the kernel is not 1x1 (its own measurements: larger
planes, where the im2row is nine copies of the input, and 1x1 convs, strided or not, were
not faster). ``plan`` returns None (the caller keeps its routes) without the packed
kernel or numba, and for shapes outside ``FEW_PIXELS`` or with too little K. A batch
runs in chunks of images, one call each, whose im2row stays under ``CHUNK_A_FLOATS``:
before, a batch whose im2row passed ``MAX_A_FLOATS`` left the route (ResNet-18's
512x7x7 3x3 at a batch of 32 took ``conv_cols`` at 1.2x its batch-1 time an image). Sums run
over K in (tap, channel) order with fused multiply-adds: results agree with the other
routes to float32 rounding. Thread-safe: plans are immutable; buffers are the calling
thread's scratch slots 0-2.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np

from ..common import scratch
from ..lib import gemm_packed
from ..lib.activations import _act_row
from ..lib.jit import CONTRACT, Jitted, frozen, inline

__all__ = ["FEW_PIXELS", "MIN_K", "PackedConvPlan", "pack_filters", "plan", "run"]

#: Output pixels per image up to which the route serves (16x16; 28x28 and 27x27 planes
#: measured 2-24% slower than ``conv_cols``' grid, which copies no input nine times over).
FEW_PIXELS = 256
#: K = C*KH*KW at least (stems with 3 channels keep their own routes).
MIN_K = 64
#: The most floats of one image's im2row matrix (slot 1: 16 MB).
MAX_A_FLOATS = 4 << 20
#: A batch runs in chunks of images whose im2row stays under this many floats (4 MB), one
#: image where one passes it. ResNet-18 at a batch of 32, one Zen 4 thread, µs an image
#: (512x7x7 3x3 / 256x14x14 3x3 / 128x28x28 3x3/2 -> 256): chunks of at most 1M floats
#: 2173-2210 / 2223-2255 / 1199-1229; of 4M 2253 / 2407 / 1375; the whole batch in one
#: call 2228 / 2445 / 1361; ``conv_cols`` (the route before chunks) 2690 / 2338 / 1270.
CHUNK_A_FLOATS = 1 << 20

numba: Any = None  # set by Jitted(parallel=True)
sgemm_packed: Any = None  # set by _prepare


def _packed_conv(  # pragma: no cover - numba only
    x: Any, xt: Any, a: Any, wp: Any, yt: Any, y3: Any, b: Any, res3: Any, geo: Any,
    pad_rows: Any, a_rows: Any, parts: Any, act: int, p: Any, lohi: Any, zb: Any,
) -> None:  # fmt: skip
    """The four passes (module doc). ``geo``: kh, kw, sh, sw, dh, dw, pad top, pad left,
    oh, ow; ``pad_rows`` (image, first padded row, end); ``a_rows`` (first row, end) of
    ``a``; ``parts`` (first row, end, first panel, end panel), each finished by its
    thread (``_finish``); ``zb`` zeros, a row of ``yt`` long (the kernel's unused bias)."""
    u = np.uint64
    _n_img, c_, h_, w_ = x.shape
    hp, wpd = xt.shape[1], xt.shape[2]
    kh, kw, sh, sw, dh, dw, pt, pl, oh, ow = (geo[0], geo[1], geo[2], geo[3], geo[4], geo[5],
                                              geo[6], geo[7], geo[8], geo[9])  # fmt: skip
    npx = oh * ow
    k = a.shape[1]
    np_ = yt.shape[1]
    nr = wp.shape[2]
    xf, tf, af = x.reshape(-1), xt.reshape(-1), a.reshape(-1)
    zero = xt.dtype.type(0)
    row_len = wpd * c_
    for q in numba.prange(pad_rows.shape[0]):
        i, r0, r1 = pad_rows[q, 0], pad_rows[q, 1], pad_rows[q, 2]
        for r in range(r0, r1):
            d = u((i * hp + r) * row_len)
            hh = r - pt
            if hh < 0 or hh >= h_:
                for t in range(row_len):
                    tf[d + u(t)] = zero
                continue
            for t in range(pl * c_):
                tf[d + u(t)] = zero
            for t in range((pl + w_) * c_, row_len):
                tf[d + u(t)] = zero
            src = u(i * c_ * h_ * w_ + hh * w_)
            for ww in range(w_):
                dd = d + u((pl + ww) * c_)
                s = src + u(ww)
                for c in range(c_):
                    tf[dd + u(c)] = xf[s + u(c * h_ * w_)]
    for q in numba.prange(a_rows.shape[0]):
        for g in range(a_rows[q, 0], a_rows[q, 1]):
            i = g // npx
            px = g - i * npx
            oy = px // ow
            ox = px - oy * ow
            d = u(g * k)
            for ki in range(kh):
                rbase = (i * hp + oy * sh + ki * dh) * wpd + ox * sw
                for kj in range(kw):
                    s = u((rbase + kj * dw) * c_)
                    for c in range(c_):
                        af[d + u(c)] = tf[s + u(c)]
                    d += u(c_)
    m = y3.shape[1]
    for q in numba.prange(parts.shape[0]):
        r0, r1, p0, p1 = parts[q, 0], parts[q, 1], parts[q, 2], parts[q, 3]
        sgemm_packed(a, r0 * k, k, wp, p0 * k * nr, yt, r0 * np_ + p0 * nr, np_, r1 - r0, k,
                     (p1 - p0) * nr, zb, 0, 0, nr)  # fmt: skip
        _finish(yt, y3, b, res3, r0, r1, p0 * nr, min(m, p1 * nr), act, p, lohi)


@inline
def _finish(  # pragma: no cover - numba only
    yt: Any, y3: Any, b: Any, res3: Any, r0: int, r1: int, f0: int, f1: int, act: int, p: Any,
    lohi: Any,
) -> None:  # fmt: skip
    """Rows ``[r0, r1)`` (image-major pixels) of filters ``[f0, f1)`` of ``yt`` into ``y3``
    (N, M, P): ``act((v + b) + res)``, ReLU and Clip in the same pass (NaN kept, as
    ``_act_row``), any other activation over each filter's run of pixels after; 16
    filters at a time, so ``yt``'s rows are read in runs."""
    u = np.uint64
    m, npx = y3.shape[1], y3.shape[2]
    np_ = yt.shape[1]
    has_b = b.shape[0] > 0
    has_res = res3.shape[0] > 0
    neg0, inf = -p[2], p[6]
    lo, hi = (p[2], inf) if act == 1 else (lohi[0], lohi[1]) if act == 2 else (-inf, inf)
    rest = act if act > 2 else 0
    yf, rf, ytf = y3.reshape(-1), res3.reshape(-1), yt.reshape(-1)
    for i in range(r0 // npx, (r1 - 1) // npx + 1):
        x0, x1 = max(r0, i * npx) - i * npx, min(r1, (i + 1) * npx) - i * npx
        for fb in range(f0, f1, 16):
            fe = min(f1, fb + 16)
            for px in range(x0, x1):
                s = u((i * npx + px) * np_)
                for f in range(fb, fe):
                    v = ytf[s + u(f)] + (b[f] if has_b else neg0)
                    dst = u((i * m + f) * npx + px)
                    if has_res:
                        v = v + rf[dst]
                    v = lo if v < lo else v
                    yf[dst] = hi if v > hi else v
        if rest != 0:
            for f in range(f0, f1):
                _act_row(y3[i, f, x0:x1], neg0, rest, p)


def _warm(fn: Any) -> None:
    t, nr = np.float32, (gemm_packed.tile() or gemm_packed.P16).nr
    geo = np.array([1, 1, 1, 1, 1, 1, 0, 0, 1, 2], np.int64)
    x, xt, a = np.ones((1, 2, 1, 2), t), np.zeros((1, 1, 2, 2), t), np.zeros((2, 2), t)
    # the packed filters and the bias read-only, as a model's (pack_filters, initializers)
    wp, yt, y3 = frozen(np.ones((1, 2, nr), t)), np.zeros((2, nr), t), np.zeros((1, 3, 2), t)
    one = np.array([[0, 0, 1]], np.int64)
    fn(x, xt, a, wp, yt, y3, frozen(np.zeros(3, t)), np.zeros((0, 0, 0), t), geo, one,
       np.array([[0, 2]], np.int64), np.array([[0, 2, 0, 1]], np.int64), 1, np.zeros(35, t),
       np.zeros(2, t), np.zeros(nr, t))  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    fn = gemm_packed.kernel()  # None: no numba, or a host the kernel does not run on
    module_globals["sgemm_packed"] = fn
    return fn is not None


PACKED_CONV = Jitted(_packed_conv, _warm, helpers=(_act_row, _finish), fastmath=CONTRACT,
                     parallel=True, prepare=_prepare)  # fmt: skip


class PackedConvPlan(NamedTuple):
    """How ``run`` computes one input shape (immutable)."""

    fn: Any  # PACKED_CONV's compiled function
    geo: np.ndarray  # kh, kw, sh, sw, dh, dw, pad top, pad left, oh, ow
    xt_shape: tuple[int, int, int, int]  # (N, Hp, Wp, C)
    a_shape: tuple[int, int]  # (N*P, K)
    yt_shape: tuple[int, int]  # (N*P, panels * nr)
    pad_rows: np.ndarray
    a_rows: np.ndarray
    parts: np.ndarray
    act: int  # 1 ReLU, 2 Clip, other compiled codes after, 0 none
    lohi: np.ndarray  # Clip's bounds (float32)
    zeros: np.ndarray  # a row of ``yt`` of zeros
    # the plan of the batch's last chunk where it has fewer images than ``xt_shape[0]``
    # (the images a call takes); None: every chunk is whole
    last: PackedConvPlan | None = None


def pack_filters(w: np.ndarray) -> np.ndarray | None:
    """Filters (M, C, KH, KW) as the kernel's panels of (tap, channel) rows, M rounded up to
    the panel width by zero filters; None without the packed kernel."""
    shape = gemm_packed.tile()
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
    route, or None where it does not serve: no packed kernel or numba, more than
    ``FEW_PIXELS`` output pixels an image, K under ``MIN_K``, one image's im2row over
    ``MAX_A_FLOATS``, negative pads. A batch whose im2row passes ``CHUNK_A_FLOATS`` is
    planned in chunks of images (``PackedConvPlan.last`` for a shorter last one)."""
    n, c, h, w = x_shape
    kh, kw = kernel
    oh, ow = out_shape[2], out_shape[3]
    k = c * kh * kw
    if oh * ow > FEW_PIXELS or k < MIN_K or oh * ow * k > MAX_A_FLOATS or min(pads_begin) < 0:
        return None
    if not gemm_packed.available():
        return None
    chunk = min(n, max(1, CHUNK_A_FLOATS // (oh * ow * k)))
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
    shape = gemm_packed.tile()
    if fn is None or shape is None:
        return None
    sh, sw = strides
    dh, dw = dilations
    hp = max(h + pads_begin[0], (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pads_begin[1], (ow - 1) * sw + (kw - 1) * dw + 1)
    rows = n * oh * ow
    panels = -(-m // shape.nr)
    t = max(1, threads)
    pad_rows = [(i, a, b) for i in range(n) for a, b in _spans(hp, t)]
    a_rows = _spans(rows, t)
    # each part reads all of one operand and its share of the other: share the bigger
    by_panels = panels >= t and (panels * shape.nr >= rows or rows < 2 * t * shape.mr)
    if by_panels:
        parts = [(0, rows, a, b) for a, b in _spans(panels, t)]
    else:
        parts = [(a, b, 0, panels) for a, b in _spans(rows, t, shape.mr)]
    geo = np.array([kh, kw, sh, sw, dh, dw, pads_begin[0], pads_begin[1], oh, ow], np.int64)
    lohi = np.array([params[0], params[1]], np.float32)
    arr = lambda v: np.array(v, np.int64)  # noqa: E731
    return PackedConvPlan(fn, geo, (n, hp, wp, c), (rows, k), (rows, panels * shape.nr),
                          arr(pad_rows), arr(a_rows), arr(parts), act, lohi,
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
    a = scratch(1, pp.a_shape, x.dtype)
    yt = scratch(2, pp.yt_shape, x.dtype)
    pp.fn(x, xt, a, wp, yt, y3, b, _EMPTY3 if res3 is None else res3, pp.geo, pp.pad_rows,
          pp.a_rows, pp.parts, pp.act, params, pp.lohi, pp.zeros)  # fmt: skip


_EMPTY3 = np.zeros((0, 0, 0), np.float32)
