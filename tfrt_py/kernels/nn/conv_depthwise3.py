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

Smaller planes (up to ``conv_depthwise.SAME_3X3_MAX_PIXELS``) and stride 2 take
``conv_depthwise_same``'s kernels, which keep every output's taps in a register.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ..lib.activations import PARAMS_LEN
from ..lib.jit import CONTRACT, Jitted, frozen
from .conv_direct import _act_row

__all__ = ["DEPTHWISE3", "DEPTHWISE3_PAR"]

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles.
numba: Any = None


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
           np.zeros(1, np.int64), 0, np.zeros(PARAMS_LEN, t), e, e, 0, 1, 0, 2)  # fmt: skip

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
           np.zeros(PARAMS_LEN, t), np.zeros((2, 0), t), 0, blocks)  # fmt: skip

    return warm


DEPTHWISE3 = Jitted(_depthwise3, _warmer((3, 4)), helpers=(_act_row,), fastmath=CONTRACT)
DEPTHWISE3_PAR = Jitted(
    _depthwise3_par, _warmer_par((3, 4)), helpers=(_act_row, _depthwise3), fastmath=CONTRACT,
    parallel=True,
)  # fmt: skip
