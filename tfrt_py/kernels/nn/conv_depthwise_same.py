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
from ..lib.jit import CONTRACT, Jitted, frozen, inline
from .conv_direct import _act_row

__all__ = ["SIZES", "fits", "kernels", "masks", "scratch_len"]

#: numba, set by ``Jitted(parallel=True)`` before the parallel loops below compile.
numba: Any = None

#: The kernel sizes served (one compiled pair each: the taps must be constants).
SIZES = (3, 5, 7)


def fits(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[int, ...],
    dilations: tuple[int, ...],
) -> int:
    """The kernel size K when these kernels compute the conv (2-D, one input channel per
    group, a K x K kernel of ``SIZES`` at stride 1 and dilation 1, K // 2 of padding on
    every side), else 0."""
    if len(x_shape) != 4 or w_shape[1] != 1 or w_shape[2] != w_shape[3]:
        return 0
    k = int(w_shape[2])
    p = k // 2
    ok = (
        k in SIZES and tuple(strides) == (1, 1) and tuple(dilations) == (1, 1)
        and tuple(pads) == (p, p, p, p)
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
    inf = p[6]
    lo, hi, after = -inf, inf, act != 0  # act 1 (Relu) and 2 (Clip) clamp in the loop
    if act == 1:
        lo, after = zero, False
    elif act == 2:
        lo, hi, after = p[0], p[1], False
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


def _operands(k: int) -> tuple[np.ndarray, ...]:
    """A 3x4 plane of two channels for a K x K kernel, as a model passes them (float32,
    weights and bias read-only), with its masks and scratch."""
    t = np.float32
    x, w, b = np.zeros((1, 2, 3, 4), t), frozen(np.zeros((2, 1, k, k), t)), frozen(np.zeros(2, t))
    return x, w, b, np.zeros((0, 0, 0, 0), t), np.zeros((1, 2, 3, 4), t), masks(3, 4, k)


def _warmer(k: int) -> Any:
    def warm(fn: Any) -> None:
        x, w, b, res, out, tab = _operands(k)
        e = np.zeros(0, np.float32)
        fn(x, w, b, res, out, tab, 0, np.zeros(35, np.float32),
           np.zeros(scratch_len(3, 4, k), np.float32), e, 0, 1, 0, 2)  # fmt: skip

    return warm


def _warmer_par(k: int) -> Any:
    def warm(fn: Any) -> None:
        x, w, b, res, out, tab = _operands(k)
        blocks = native_threads.plane_blocks(1, 2, 2)
        n = scratch_len(3, 4, k)
        fn(x, w, b, res, out, tab, 0, np.zeros(35, np.float32),
           np.zeros((blocks.shape[0], n), np.float32), n, blocks)  # fmt: skip

    return warm


_HELPERS = (_act_row, _planes)
_PAIRS = ((3, _same3, _same3_par), (5, _same5, _same5_par), (7, _same7, _same7_par))
_KERNELS: dict[int, tuple[Jitted, Jitted]] = {
    k: (
        Jitted(serial, _warmer(k), helpers=_HELPERS, fastmath=CONTRACT),
        Jitted(par, _warmer_par(k), helpers=_HELPERS, fastmath=CONTRACT, parallel=True),
    )
    for k, serial, par in _PAIRS
}


def kernels(k: int) -> tuple[Jitted, Jitted]:
    """The serial and the parallel kernel for K x K (``SIZES``)."""
    return _KERNELS[k]
