"""Depthwise convs of a 3x3, 5x5 or 7x7 kernel at stride 1 with "same" padding (K // 2 on
every side): MobileNet's, EfficientNet's and ConvNeXt's stride-1 depthwise layers, the
taps of each output kept in a register.

``conv_depthwise3.DEPTHWISE3`` (3x3 only) runs the rows with a row above and below as one
flat loop and the first and last row and column of every row in scalar code; on the small
planes of a network's last stages most pixels are such edges (24 of 49 at 7x7), so a
960x7x7 conv took 96 µs where onnxruntime takes 37 (2-core AMD EPYC Zen 4, one thread);
5x5 convs ran ``conv_direct``'s polyphase grid (1152x7x7: 249 µs, onnxruntime 62). Here,
per channel:

1. the channel is copied into the middle of a flat scratch ``xp`` of ``(H + 2P) * W + 2P``
   elements (P = K // 2) whose first and last ``P * W + P`` stay zero (set once a call):
   output ``t`` (row-major over the H x W plane) reads tap (i, j) at ``xp[t + i*W + j]``,
   and a tap row above or below the image reads the zeros;
2. one flat loop over the plane's outputs, each the bias plus its K*K taps with constant
   trip counts (unrolled; the loop over outputs vectorizes), a tap whose column falls
   outside the image (where the flat index wraps into the neighbouring row) masked to zero
   by a select from the plan's table ``tab`` (K rows of H*W 0/1: column ``ow + j - P``
   inside the image), never by a multiply: a masked tap adds exactly what a zero pad adds;
3. the residual and ReLU/Clip in the same loop (a pass of ``_act_row`` per 49-pixel plane
   cost a 960x7x7 conv 20 of its 60 µs), other activations over the plane while it is in
   cache (``conv_direct``'s ``_act_row``).

960x7x7 3x3: 96 -> 34 µs, 576x14x14 99 -> 53, 192x28x28 79 -> 65, 144x56x56 198 -> 187;
672x14x14 5x5 311 -> 167, 1152x7x7 5x5 249 -> 91 (same host, one thread; onnxruntime 37,
82, 82, 220, 140, 62). Same signatures as ``conv_depthwise3``'s kernels (``tab`` the
masks, ``xp`` the scratch, ``acc`` unused), so ``conv_depthwise``'s plan runs either; it
takes these for float32/float64 convs of that geometry (``kernels``). Sums run in another
order than im2col + GEMM: results differ by rounding only. Compiled with ``jit.CONTRACT``.
Thread-safe: no state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ..lib.activations import PARAMS_LEN
from ..lib.jit import CONTRACT, Jitted, frozen, inline
from .conv_direct import _act_row

__all__ = ["SIZES", "SIZES_S2", "fits", "kernels", "masks", "masks_s2", "scratch_len",
           "scratch_len_s2"]  # fmt: skip

#: numba, set by ``Jitted(parallel=True)`` before the parallel loops below compile.
numba: Any = None

#: The kernel sizes served (one compiled pair each: the taps must be constants).
SIZES = (3, 5, 7)
#: ... at stride 2.
SIZES_S2 = (3, 5)


def fits(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[int, ...],
    dilations: tuple[int, ...],
    stride: int = 1,
) -> int:
    """The kernel size K when these kernels compute the conv at ``stride`` (1 or 2): 2-D,
    one input channel per group, a K x K kernel of ``SIZES`` (``SIZES_S2`` at stride 2),
    dilation 1, K // 2 of padding on every side; else 0."""
    if len(x_shape) != 4 or w_shape[1] != 1 or w_shape[2] != w_shape[3]:
        return 0
    k = int(w_shape[2])
    p = k // 2
    ok = (
        k in (SIZES if stride == 1 else SIZES_S2) and tuple(strides) == (stride, stride)
        and tuple(dilations) == (1, 1) and tuple(pads) == (p, p, p, p)
    )  # fmt: skip
    return k if ok else 0


def scratch_len(h: int, w: int, k: int) -> int:
    """The elements of one thread's ``xp`` for an H x W plane and a K x K kernel."""
    p = k // 2
    return (h + 2 * p) * w + 2 * p


def masks(h: int, w: int, k: int) -> np.ndarray:
    """``tab``: (K, H*W) int64, 1 where tap column j of output t is inside the image."""
    col = np.arange(h * w, dtype=np.int64) % w
    shifted = col[None, :] + np.arange(k, dtype=np.int64)[:, None] - k // 2
    return np.ascontiguousarray(((shifted >= 0) & (shifted < w)).astype(np.uint8))


@inline
def _bounds(act: int, p: Any) -> tuple[Any, Any, bool]:  # pragma: no cover - numba only
    """(lo, hi, after): ReLU (act 1) and Clip (act 2) as a clamp in the outputs' loop
    (NaN kept), no-op bounds for the others, which ``_act_row`` applies after (``after``)."""
    inf = p[6]
    if act == 1:
        return p[2], inf, False
    if act == 2:
        return p[0], p[1], False
    return -inf, inf, act != 0


@inline
def _planes(  # pragma: no cover - numba only
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
    n0: int, n1: int, g0: int, g1: int, k: int,
) -> None:  # fmt: skip
    """out[n, m] = act(conv(x[n, g], w[m]) + b[m] (+ res[n, m])) for images ``[n0, n1)``
    and input channels ``[g0, g1)`` (output channels ``g * mult .. (g + 1) * mult``), the
    K x K kernel ``k`` a constant of the caller (inlined)."""
    h, wd = x.shape[2], x.shape[3]
    hw = h * wd
    c_in, m_out = x.shape[1], w.shape[0]
    mult = m_out // c_in
    has_res = res.shape[0] > 0
    zero = p[2]
    pk = k // 2
    kk = k * k
    uw, uhw = np.uint64(wd), np.uint64(hw)
    base = np.uint64(pk * wd + pk)
    xa, ya = x.reshape(x.size), out.reshape(out.size)
    wa, ta = w.reshape(w.size), tab.reshape(tab.size)
    ra = res.reshape(res.size)
    lo, hi, after = _bounds(act, p)
    for t in range(pk * wd + pk):  # 1. the margins: zero for the whole call
        xp[t] = zero
        xp[base + uhw + np.uint64(t)] = zero
    for n in range(n0, n1):
        for g in range(g0, g1):
            xb = np.uint64((n * c_in + g) * hw)
            for t in range(hw):
                xp[base + np.uint64(t)] = xa[xb + np.uint64(t)]
            for m in range(g * mult, (g + 1) * mult):
                yb = np.uint64((n * m_out + m) * hw)
                wb = np.uint64(m * kk)
                bm = b[m]
                rb = np.uint64((n * m_out + m) * hw) if has_res else np.uint64(0)
                for t in range(hw):  # 2. every output: bias + taps, masked columns
                    ut = np.uint64(t)
                    acc = bm
                    for i in range(k):
                        for j in range(k):
                            uj = np.uint64(j)
                            v = xp[ut + np.uint64(i) * uw + uj]
                            tap = wa[wb + np.uint64(i * k + j)]
                            acc += tap * (v if ta[uj * uhw + ut] != 0 else zero)
                    if has_res:
                        acc += ra[rb + ut]
                    acc = lo if acc < lo else acc  # Relu/Clip here (NaN kept), else no-ops
                    ya[yb + ut] = hi if acc > hi else acc
                if after:  # 3. the other activations over the plane, while in cache
                    _act_row(ya[yb : yb + uhw], -zero, act, p)


def _same3(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
           acc: Any, n0: int, n1: int, g0: int, g1: int) -> None:  # pragma: no cover  # fmt: skip
    """``_planes`` for 3x3 kernels (``conv_depthwise3``'s signature; ``acc`` unused)."""
    _planes(x, w, b, res, out, tab, act, p, xp, n0, n1, g0, g1, 3)


def _same5(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
           acc: Any, n0: int, n1: int, g0: int, g1: int) -> None:  # pragma: no cover  # fmt: skip
    """``_planes`` for 5x5 kernels."""
    _planes(x, w, b, res, out, tab, act, p, xp, n0, n1, g0, g1, 5)


def _same7(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
           acc: Any, n0: int, n1: int, g0: int, g1: int) -> None:  # pragma: no cover  # fmt: skip
    """``_planes`` for 7x7 kernels."""
    _planes(x, w, b, res, out, tab, act, p, xp, n0, n1, g0, g1, 7)


def _same3_par(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any,
               buf: Any, xp_len: int, blocks: Any) -> None:  # pragma: no cover  # fmt: skip
    """``_planes`` (3x3) over ``blocks`` (rows n0, n1, g0, g1) in a ``prange`` loop on
    native threads, block ``q`` with ``buf[q]`` as its scratch."""
    for q in numba.prange(blocks.shape[0]):
        _planes(x, w, b, res, out, tab, act, p, buf[q, :xp_len],
                blocks[q, 0], blocks[q, 1], blocks[q, 2], blocks[q, 3], 3)  # fmt: skip


def _same5_par(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any,
               buf: Any, xp_len: int, blocks: Any) -> None:  # pragma: no cover  # fmt: skip
    """``_same3_par`` for 5x5 kernels."""
    for q in numba.prange(blocks.shape[0]):
        _planes(x, w, b, res, out, tab, act, p, buf[q, :xp_len],
                blocks[q, 0], blocks[q, 1], blocks[q, 2], blocks[q, 3], 5)  # fmt: skip


def _same7_par(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any,
               buf: Any, xp_len: int, blocks: Any) -> None:  # pragma: no cover  # fmt: skip
    """``_same3_par`` for 7x7 kernels."""
    for q in numba.prange(blocks.shape[0]):
        _planes(x, w, b, res, out, tab, act, p, buf[q, :xp_len],
                blocks[q, 0], blocks[q, 1], blocks[q, 2], blocks[q, 3], 7)  # fmt: skip


def _phase_geometry(h: int, w: int, k: int) -> tuple[int, int, int, int]:
    """(OH, OW, M, L): the output plane, the zero rows above and below each phase plane,
    and one phase plane's length in the scratch."""
    oh, ow = (h + 1) // 2, (w + 1) // 2
    m = (k // 2 + 1) // 2
    return oh, ow, m, oh * ow + 2 * (m * ow + m)


def scratch_len_s2(h: int, w: int, k: int) -> int:
    """The elements of one thread's scratch at stride 2: four phase planes."""
    return 4 * _phase_geometry(h, w, k)[3]


def masks_s2(h: int, w: int, k: int) -> np.ndarray:
    """``tab`` at stride 2: (K, OH*OW) uint8, 1 where tap column j of output t reads a
    column of its phase plane (``(j - K // 2)`` even: the even input columns, else odd)."""
    oh, ow, _, _ = _phase_geometry(h, w, k)
    col = np.arange(oh * ow, dtype=np.int64) % ow
    rows = []
    for j in range(k):
        r = j - k // 2
        cp = r & 1
        dc = (r - cp) // 2
        cols = (w + 1) // 2 if cp == 0 else w // 2
        rows.append((col + dc >= 0) & (col + dc < cols))
    return np.ascontiguousarray(np.array(rows).astype(np.uint8))


@inline
def _planes_s2(  # pragma: no cover - numba only
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
    n0: int, n1: int, g0: int, g1: int, k: int,
) -> None:  # fmt: skip
    """``_planes`` at stride 2, polyphase: each channel is split into its four phase
    planes (even/odd rows x even/odd columns, rows OW wide, M zero rows above and below),
    where every tap of output t is one read at a fixed offset from t; a tap outside its
    phase plane's columns is masked by ``tab``, rows outside read the zeros (the scratch
    is zeroed once a call; the copies never write where a plane has no row or column)."""
    h, wd = x.shape[2], x.shape[3]
    hw = h * wd
    oh_n, ow_n = out.shape[2], out.shape[3]
    ohw = oh_n * ow_n
    c_in, m_out = x.shape[1], w.shape[0]
    mult = m_out // c_in
    has_res = res.shape[0] > 0
    zero = p[2]
    pk = k // 2
    kk = k * k
    mg = (pk + 1) // 2
    plane = ohw + 2 * (mg * ow_n + mg)
    first = mg * ow_n + mg  # a plane's (0, 0) in its stretch of the scratch
    uohw = np.uint64(ohw)
    xa, ya = x.reshape(x.size), out.reshape(out.size)
    wa, ta = w.reshape(w.size), tab.reshape(tab.size)
    ra = res.reshape(res.size)
    lo, hi, after = _bounds(act, p)
    for t in range(4 * plane):
        xp[t] = zero
    h0, h1, w0, w1 = (h + 1) // 2, h // 2, (wd + 1) // 2, wd // 2
    for n in range(n0, n1):
        for g in range(g0, g1):
            xb = (n * c_in + g) * hw
            for a in range(h0):  # the even rows: phases 0 (even columns) and 1 (odd)
                src = np.uint64(xb + 2 * a * wd)
                d0 = np.uint64(first + a * ow_n)
                d1 = np.uint64(plane + first + a * ow_n)
                for c in range(w1):
                    xp[d0 + np.uint64(c)] = xa[src + np.uint64(2 * c)]
                    xp[d1 + np.uint64(c)] = xa[src + np.uint64(2 * c + 1)]
                if w0 > w1:
                    xp[d0 + np.uint64(w1)] = xa[src + np.uint64(2 * w1)]
            for a in range(h1):  # the odd rows: phases 2 and 3
                src = np.uint64(xb + (2 * a + 1) * wd)
                d2 = np.uint64(2 * plane + first + a * ow_n)
                d3 = np.uint64(3 * plane + first + a * ow_n)
                for c in range(w1):
                    xp[d2 + np.uint64(c)] = xa[src + np.uint64(2 * c)]
                    xp[d3 + np.uint64(c)] = xa[src + np.uint64(2 * c + 1)]
                if w0 > w1:
                    xp[d2 + np.uint64(w1)] = xa[src + np.uint64(2 * w1)]
            for m in range(g * mult, (g + 1) * mult):
                yb = np.uint64((n * m_out + m) * ohw)
                wb = np.uint64(m * kk)
                bm = b[m]
                for t in range(ohw):
                    ut = np.uint64(t)
                    acc = bm
                    for i in range(k):
                        ri = i - pk
                        rp = ri & 1
                        dr = (ri - rp) // 2
                        for j in range(k):
                            rj = j - pk
                            cp = rj & 1
                            dc = (rj - cp) // 2
                            off = np.uint64((2 * rp + cp) * plane + first + dr * ow_n + dc)
                            v = xp[off + ut]
                            tap = wa[wb + np.uint64(i * k + j)]
                            acc += tap * (v if ta[np.uint64(j) * uohw + ut] != 0 else zero)
                    if has_res:
                        acc += ra[yb + ut]
                    acc = lo if acc < lo else acc
                    ya[yb + ut] = hi if acc > hi else acc
                if after:
                    _act_row(ya[yb : yb + uohw], -zero, act, p)


def _s2_3(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
          acc: Any, n0: int, n1: int, g0: int, g1: int) -> None:  # pragma: no cover  # fmt: skip
    """``_planes_s2`` for 3x3 kernels."""
    _planes_s2(x, w, b, res, out, tab, act, p, xp, n0, n1, g0, g1, 3)


def _s2_5(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
          acc: Any, n0: int, n1: int, g0: int, g1: int) -> None:  # pragma: no cover  # fmt: skip
    """``_planes_s2`` for 5x5 kernels."""
    _planes_s2(x, w, b, res, out, tab, act, p, xp, n0, n1, g0, g1, 5)


def _s2_3_par(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any,
              buf: Any, xp_len: int, blocks: Any) -> None:  # pragma: no cover  # fmt: skip
    """``_planes_s2`` (3x3) over ``blocks`` in a ``prange`` loop on native threads."""
    for q in numba.prange(blocks.shape[0]):
        _planes_s2(x, w, b, res, out, tab, act, p, buf[q, :xp_len],
                   blocks[q, 0], blocks[q, 1], blocks[q, 2], blocks[q, 3], 3)  # fmt: skip


def _s2_5_par(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any,
              buf: Any, xp_len: int, blocks: Any) -> None:  # pragma: no cover  # fmt: skip
    """``_s2_3_par`` for 5x5 kernels."""
    for q in numba.prange(blocks.shape[0]):
        _planes_s2(x, w, b, res, out, tab, act, p, buf[q, :xp_len],
                   blocks[q, 0], blocks[q, 1], blocks[q, 2], blocks[q, 3], 5)  # fmt: skip


def _operands(k: int, stride: int) -> tuple[Any, ...]:
    """A 3x4 plane of two channels for a K x K kernel, as a model passes them (float32,
    weights and bias read-only), with its output, masks and scratch length."""
    t = np.float32
    x, w, b = np.zeros((1, 2, 3, 4), t), frozen(np.zeros((2, 1, k, k), t)), frozen(np.zeros(2, t))
    res = np.zeros((0, 0, 0, 0), t)
    if stride == 1:
        return x, w, b, res, np.zeros((1, 2, 3, 4), t), masks(3, 4, k), scratch_len(3, 4, k)
    return x, w, b, res, np.zeros((1, 2, 2, 2), t), masks_s2(3, 4, k), scratch_len_s2(3, 4, k)


def _warmer(k: int, stride: int) -> Any:
    def warm(fn: Any) -> None:
        x, w, b, res, out, tab, n = _operands(k, stride)
        e = np.zeros(0, np.float32)
        fn(x, w, b, res, out, tab, 0, np.zeros(PARAMS_LEN, np.float32), np.zeros(n, np.float32), e,
           0, 1, 0, 2)  # fmt: skip

    return warm


def _warmer_par(k: int, stride: int) -> Any:
    def warm(fn: Any) -> None:
        x, w, b, res, out, tab, n = _operands(k, stride)
        blocks = native_threads.plane_blocks(1, 2, 2)
        fn(x, w, b, res, out, tab, 0, np.zeros(PARAMS_LEN, np.float32),
           np.zeros((blocks.shape[0], n), np.float32), n, blocks)  # fmt: skip

    return warm


_HELPERS = (_act_row, _bounds, _planes, _planes_s2)
_PAIRS = (
    (1, 3, _same3, _same3_par), (1, 5, _same5, _same5_par), (1, 7, _same7, _same7_par),
    (2, 3, _s2_3, _s2_3_par), (2, 5, _s2_5, _s2_5_par),
)  # fmt: skip
_KERNELS: dict[tuple[int, int], tuple[Jitted, Jitted]] = {
    (s, k): (
        Jitted(serial, _warmer(k, s), helpers=_HELPERS, fastmath=CONTRACT),
        Jitted(par, _warmer_par(k, s), helpers=_HELPERS, fastmath=CONTRACT, parallel=True),
    )
    for s, k, serial, par in _PAIRS
}


def kernels(k: int, stride: int = 1) -> tuple[Jitted, Jitted]:
    """The serial and the parallel kernel for K x K (``SIZES``; ``SIZES_S2`` at stride
    2)."""
    return _KERNELS[stride, k]
