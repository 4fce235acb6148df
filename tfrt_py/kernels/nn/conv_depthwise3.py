"""A 3x3 stride-1 depthwise conv with one pixel of zero padding on every side (output the
size of the input: MobileNet's and EfficientNet's stride-1 depthwise layers), computed
straight from the input into the output, with no padded copy.

``conv_direct._depthwise2d`` serves every depthwise geometry by copying each channel into
a zero-padded plane, running the taps over a grid as wide as the padded rows and copying
the grid's valid columns out: on a 144x56x56 plane, 73 of its 296 µs went into the copy
in, 45 into the copy out and 15 into starting the grid at the bias. Here, per channel:

1. the rows with a row above and below (``1 <= oh < H - 1``) as one flat loop over their
   elements, each the bias plus the nine taps read at fixed offsets in the flattened
   input (``x[t - W - 1]``, ..., ``x[t + W + 1]``). The first and last column of each such
   row read the neighbouring row's edge instead of the padding: they are written again in
   step 3;
2. the first and last row, columns ``1 .. W - 2``: the bias and the six taps of the two
   rows inside the image, again a flat loop;
3. the first and last column of every row, each from the four or six taps inside the
   image (scalar code);
4. the residual, then the activation over the plane while it is in cache (``conv_direct``'s
   ``_act_row``).

Same signature as ``_depthwise2d`` (its table and scratch arguments unused) so that
``conv_depthwise`` runs either through one plan; ``conv_depthwise.plan_depthwise`` takes
this one for float32/float64 convs of that geometry with one input channel per group and
planes of at least 3x3. Sums run in another order than im2col + GEMM: results differ by
rounding only. Compiled with ``jit.CONTRACT`` (fused multiply-adds). Thread-safe: no
state.

The stride-2 kernel (``_depthwise3s2``, ``DEPTHWISE3S2``: MobileNet's and EfficientNet's
downsampling depthwise layers, on small planes: ``conv_depthwise.S2_DIRECT_MAX_PIXELS``).
``conv_direct._depthwise2d`` runs a stride-2 conv polyphase over a padded copy of each
channel: at the small planes of a network's last stages its per-channel copies and grid
passes cost more than the taps (576x14x14: 307 µs, onnxruntime 168). Here, per channel,
output row ``oh`` reads input rows ``2 oh - 1 .. 2 oh + 1`` and output column ``ow`` input
columns ``2 ow - 1 .. 2 ow + 1``:

1. per output row, the columns whose three taps fall inside the image (``1 <= ow <= (W -
   2) // 2``): the bias plus the taps of the tap rows inside the image (the first output
   row has no row above, the last one none below when H is odd: a row in the padding
   adds nothing, where a zero weight would make 0 * inf a NaN);
2. the first column (two taps a row) and, when W is odd, the last (two taps a row);
3. the residual, then the activation over the plane while it is in cache
   (``conv_direct``'s ``_act_row``).

Each output sums its taps row by row (a row's three, then the rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ..lib.jit import CONTRACT, Jitted, frozen
from .conv_direct import _act_row

__all__ = ["DEPTHWISE3", "DEPTHWISE3S2", "DEPTHWISE3S2_PAR", "DEPTHWISE3_PAR", "fits"]

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles.
numba: Any = None


def fits(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
    dilations: tuple[int, int],
    stride: int = 1,
) -> bool:
    """Whether the kernel of ``stride`` (1: ``DEPTHWISE3``, 2: ``DEPTHWISE3S2``) computes
    the conv: 2-D, one input channel per group, a 3x3 kernel at that stride in both
    dimensions and dilation 1, one pixel of padding on every side, a plane of at least
    3x3."""
    return (
        len(x_shape) == 4 and w_shape[1] == 1 and tuple(w_shape[2:]) == (3, 3)
        and tuple(strides) == (stride, stride) and tuple(dilations) == (1, 1)
        and tuple(pads) == (1, 1, 1, 1) and x_shape[2] >= 3 and x_shape[3] >= 3
    )  # fmt: skip


def _depthwise3(  # pragma: no cover - numba only
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any, acc: Any,
    n0: int, n1: int, g0: int, g1: int,
) -> None:  # fmt: skip
    """out[n, m] = act(conv(x[n, g], w[m]) + b[m] (+ res[n, m])) for images ``[n0, n1)``
    and input channels ``[g0, g1)`` (output channels ``g * mult .. (g + 1) * mult``);
    ``res`` empty: no residual. ``tab``, ``xp``, ``acc``: unused (``_depthwise2d``'s).

    Every access is a flat unsigned index into the whole input, output and weights: a
    view per channel and per tap (~25 of them) cost a 1152x7x7 conv 133 µs against 90."""
    h, wd = x.shape[2], x.shape[3]
    hw = h * wd
    c_in, m_out = x.shape[1], w.shape[0]
    mult = m_out // c_in
    has_res = res.shape[0] > 0
    zero = p[2]
    uw, u1, u2 = np.uint64(wd), np.uint64(1), np.uint64(2)
    xa, ya, wa = x.reshape(x.size), out.reshape(out.size), w.reshape(w.size)
    n_in = (h - 1) * wd - 1 - (wd + 1)  # step 1: from (1, 1) through (H - 2, W - 2)
    lr = np.uint64((h - 1) * wd)  # the first element of the last row
    for n in range(n0, n1):
        for g in range(g0, g1):
            xb = np.uint64((n * c_in + g) * hw)
            for m in range(g * mult, (g + 1) * mult):
                yb = np.uint64((n * m_out + m) * hw)
                wb = np.uint64(m * 9)
                w0, w1, w2 = wa[wb], wa[wb + u1], wa[wb + u2]
                w3, w4, w5 = wa[wb + np.uint64(3)], wa[wb + np.uint64(4)], wa[wb + np.uint64(5)]
                w6, w7, w8 = wa[wb + np.uint64(6)], wa[wb + np.uint64(7)], wa[wb + np.uint64(8)]
                bm = b[m]
                # 1. the rows with a row above and below, flat
                c, d = xb + uw + u1, yb + uw + u1
                for t in range(n_in):
                    u = c + np.uint64(t)
                    a, z = u - uw, u + uw
                    ya[d + np.uint64(t)] = bm + (
                        (w0 * xa[a - u1] + w1 * xa[a] + w2 * xa[a + u1])
                        + (w3 * xa[u - u1] + w4 * xa[u] + w5 * xa[u + u1])
                        + (w6 * xa[z - u1] + w7 * xa[z] + w8 * xa[z + u1])
                    )
                # 2. the first and the last row, columns 1 .. W - 2
                for t in range(wd - 2):
                    u = xb + np.uint64(t)
                    ya[yb + u1 + np.uint64(t)] = bm + (
                        (w3 * xa[u] + w4 * xa[u + u1] + w5 * xa[u + u2])
                        + (w6 * xa[u + uw] + w7 * xa[u + uw + u1] + w8 * xa[u + uw + u2])
                    )
                for t in range(wd - 2):
                    u = xb + lr + np.uint64(t)
                    ya[yb + lr + u1 + np.uint64(t)] = bm + (
                        (w0 * xa[u - uw] + w1 * xa[u - uw + u1] + w2 * xa[u - uw + u2])
                        + (w3 * xa[u] + w4 * xa[u + u1] + w5 * xa[u + u2])
                    )
                # 3. the first and the last column of every row
                for oh in range(h):
                    r = xb + np.uint64(oh) * uw
                    e = r + uw - u2  # the row's last two columns: e, e + 1
                    left = w4 * xa[r] + w5 * xa[r + u1]
                    right = w3 * xa[e] + w4 * xa[e + u1]
                    if oh > 0:
                        left += w1 * xa[r - uw] + w2 * xa[r - uw + u1]
                        right += w0 * xa[e - uw] + w1 * xa[e - uw + u1]
                    if oh < h - 1:
                        left += w7 * xa[r + uw] + w8 * xa[r + uw + u1]
                        right += w6 * xa[e + uw] + w7 * xa[e + uw + u1]
                    ry = yb + np.uint64(oh) * uw
                    ya[ry] = bm + left
                    ya[ry + uw - u1] = bm + right
                # 4. residual, activation, over the plane while it is in cache
                yf = ya[yb : yb + np.uint64(hw)]
                if has_res:
                    rf = res[n, m].reshape(hw)
                    for t in range(hw):
                        yf[t] += rf[t]
                if act != 0:
                    _act_row(yf, -zero, act, p)


def _depthwise3_par(  # pragma: no cover - numba only
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, buf: Any,
    xp_len: int, blocks: Any,
) -> None:  # fmt: skip
    """``_depthwise3`` over ``blocks`` (rows n0, n1, g0, g1) in a ``prange`` loop on native
    threads (``_depthwise2d_par``'s signature; ``buf``, ``xp_len`` unused)."""
    for k in numba.prange(blocks.shape[0]):
        _depthwise3(x, w, b, res, out, tab, act, p, buf[k], buf[k],
                    blocks[k, 0], blocks[k, 1], blocks[k, 2], blocks[k, 3])  # fmt: skip


def _depthwise3s2(  # pragma: no cover - numba only
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any, acc: Any,
    n0: int, n1: int, g0: int, g1: int,
) -> None:  # fmt: skip
    """out[n, m] = act(conv(x[n, g], w[m]) + b[m] (+ res[n, m])) for images ``[n0, n1)``
    and input channels ``[g0, g1)`` (output channels ``g * mult .. (g + 1) * mult``);
    ``res`` empty: no residual. ``tab``, ``xp``, ``acc``: unused (``_depthwise2d``'s).
    Flat unsigned indices into the whole arrays, as ``conv_depthwise3``."""
    h, wd = x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    hw, ohw = h * wd, oh_n * ow_n
    c_in, m_out = x.shape[1], w.shape[0]
    mult = m_out // c_in
    has_res = res.shape[0] > 0
    zero = p[2]
    ow_hi = (wd - 2) // 2  # the last output column whose taps are all inside
    uw, u1, u2 = np.uint64(wd), np.uint64(1), np.uint64(2)
    xa, ya, wa = x.reshape(x.size), out.reshape(out.size), w.reshape(w.size)
    for n in range(n0, n1):
        for g in range(g0, g1):
            xb = np.uint64((n * c_in + g) * hw)
            for m in range(g * mult, (g + 1) * mult):
                yb = np.uint64((n * m_out + m) * ohw)
                wb = np.uint64(m * 9)
                w0, w1, w2 = wa[wb], wa[wb + u1], wa[wb + u2]
                w3, w4, w5 = wa[wb + np.uint64(3)], wa[wb + np.uint64(4)], wa[wb + np.uint64(5)]
                w6, w7, w8 = wa[wb + np.uint64(6)], wa[wb + np.uint64(7)], wa[wb + np.uint64(8)]
                bm = b[m]
                for oh in range(oh_n):
                    yr = yb + np.uint64(oh * ow_n)
                    # input rows 2 oh - 1 (not for the first row), 2 oh, 2 oh + 1 (not
                    # past the last): a row in the padding adds nothing (0 * inf is NaN)
                    top, low = oh >= 1, 2 * oh + 1 <= h - 1
                    rb = xb + np.uint64(2 * oh) * uw
                    ra = rb - uw if top else rb
                    rc = rb + uw if low else rb
                    # 1. columns with all three taps inside: 2 ow - 1 .. 2 ow + 1
                    for ow in range(1, ow_hi + 1):
                        c = np.uint64(2 * ow - 1)
                        a, u, z = ra + c, rb + c, rc + c
                        mid = w3 * xa[u] + w4 * xa[u + u1] + w5 * xa[u + u2]
                        if top:
                            mid = (w0 * xa[a] + w1 * xa[a + u1] + w2 * xa[a + u2]) + mid
                        if low:
                            mid = mid + (w6 * xa[z] + w7 * xa[z + u1] + w8 * xa[z + u2])
                        ya[yr + np.uint64(ow)] = bm + mid
                    # 2. the first column (taps 0, 1) and a last one past the image's
                    # (taps 2 ow - 1, 2 ow)
                    mid = w4 * xa[rb] + w5 * xa[rb + u1]
                    if top:
                        mid = (w1 * xa[ra] + w2 * xa[ra + u1]) + mid
                    if low:
                        mid = mid + (w7 * xa[rc] + w8 * xa[rc + u1])
                    ya[yr] = bm + mid
                    for ow in range(ow_hi + 1, ow_n):
                        c = np.uint64(2 * ow - 1)
                        a, u, z = ra + c, rb + c, rc + c
                        mid = w3 * xa[u] + w4 * xa[u + u1]
                        if top:
                            mid = (w0 * xa[a] + w1 * xa[a + u1]) + mid
                        if low:
                            mid = mid + (w6 * xa[z] + w7 * xa[z + u1])
                        ya[yr + np.uint64(ow)] = bm + mid
                # 3. residual, activation, over the plane while it is in cache
                yf = ya[yb : yb + np.uint64(ohw)]
                if has_res:
                    rf = res[n, m].reshape(ohw)
                    for t in range(ohw):
                        yf[t] += rf[t]
                if act != 0:
                    _act_row(yf, -zero, act, p)


def _depthwise3s2_par(  # pragma: no cover - numba only
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, buf: Any,
    xp_len: int, blocks: Any,
) -> None:  # fmt: skip
    """``_depthwise3s2`` over ``blocks`` (rows n0, n1, g0, g1) in a ``prange`` loop on
    native threads (``_depthwise2d_par``'s signature; ``buf``, ``xp_len`` unused)."""
    for k in numba.prange(blocks.shape[0]):
        _depthwise3s2(x, w, b, res, out, tab, act, p, buf[k], buf[k],
                      blocks[k, 0], blocks[k, 1], blocks[k, 2], blocks[k, 3])  # fmt: skip


def _warmer(out_hw: tuple[int, int]) -> Any:
    """The warm-up of a kernel over a 3x4 plane whose output plane is ``out_hw``."""

    def warm(fn: Any) -> None:  # float32, weights and bias read-only: as a model calls it
        t = np.float32
        x, w, b = (
            np.zeros((1, 2, 3, 4), t),
            frozen(np.zeros((2, 1, 3, 3), t)),
            frozen(np.zeros(2, t)),
        )
        e = np.zeros(0, t)
        fn(x, w, b, np.zeros((0, 0, 0, 0), t), np.zeros((1, 2, *out_hw), t),
           np.zeros(1, np.int64), 0, np.zeros(35, t), e, e, 0, 1, 0, 2)  # fmt: skip

    return warm


def _warmer_par(out_hw: tuple[int, int]) -> Any:
    """The same for a kernel's parallel loop over two blocks."""

    def warm(fn: Any) -> None:  # as a model calls it: read-only weights, bias, blocks
        t = np.float32
        x, w, b = (
            np.zeros((1, 2, 3, 4), t),
            frozen(np.zeros((2, 1, 3, 3), t)),
            frozen(np.zeros(2, t)),
        )
        blocks = native_threads.plane_blocks(1, 2, 2)
        out = np.zeros((1, 2, *out_hw), t)
        fn(x, w, b, np.zeros((0, 0, 0, 0), t), out, np.zeros(1, np.int64), 0,
           np.zeros(35, t), np.zeros((2, 0), t), 0, blocks)  # fmt: skip

    return warm


DEPTHWISE3 = Jitted(_depthwise3, _warmer((3, 4)), helpers=(_act_row,), fastmath=CONTRACT)
DEPTHWISE3_PAR = Jitted(
    _depthwise3_par, _warmer_par((3, 4)), helpers=(_act_row, _depthwise3), fastmath=CONTRACT,
    parallel=True,
)  # fmt: skip
DEPTHWISE3S2 = Jitted(_depthwise3s2, _warmer((2, 2)), helpers=(_act_row,), fastmath=CONTRACT)
DEPTHWISE3S2_PAR = Jitted(
    _depthwise3s2_par, _warmer_par((2, 2)), helpers=(_act_row, _depthwise3s2),
    fastmath=CONTRACT, parallel=True,
)  # fmt: skip
