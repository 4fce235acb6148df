"""Grouped float32 2-D convolutions (4 or more channels a group, more than one group) on
``conv_cols``' kernel: each (image, group) pair is the one-group conv of its ``C/group``
channels into its ``M/group`` filters, all pairs in one compiled call.

RegNetX's 3x3 convs (16 channels a group: 400x7x7 in 25 groups), RegNetY's (8) and
ResNeXt's (4) ran on the direct depthwise kernel (``conv_depthwise``: each output channel
a few passes of its group's taps over the grid, at most 16 channels a group) or, wider,
on ``conv_blocked``'s BLAS parts (an im2col and a small ``sgemm`` a group); onnxruntime's
NCHWc kernel, whose 16-channel blocks are a group, ran them 1.6-3x faster. Here a pair's
channels are a contiguous run of the NCHW input (its planes) and its filters a
contiguous run of the output's, so a pair is exactly ``conv_cols._block`` on views of
those runs: GRID reads the group's padded rows in place (stride 1, and strided convs over
their phases whatever the rows' width), IM2COL copies its columns (strided, under 16
channels a group), DIRECT reads a 1x1 conv's planes; bias, residual and ReLU/Clip are
applied before the one store, other activations over each filter's rows after it. One
Zen 4 thread (2026-12-07, AVX-512; the conv and its ReLU alone, µs, this route / before /
onnxruntime): 400x7x7 in 25 groups 120 / 263 / 87, 160x14x14 in 10 128 / 228 / 102,
64x28x28 in 4 164 / 312 / 160, 32x112x112 in 2 1315 / 2267 / 1319, 208x14x14 in 26 (8 a
group) 109 / 169 / 218, 128x56x56 in 32 (4 a group) 539 / 787 / 1340; on two threads
400x7x7 95 / 181 / 86.

The pairs run in a ``prange`` loop on native threads (each thread its own scratch rows)
where the product is big enough to split (``gemm.NATIVE_SPLIT_MIN_MACS``), else on the
caller. The weights are (groups, M/group, K): taps-first per group for GRID
(``taps_first``), as they are for the other forms. ``plan`` returns None (the caller keeps
its routes) without numba or the kernel and for fewer than ``MIN_CHANNELS`` channels a
group (``serves``: the direct depthwise kernel keeps those). Sums are the one-group
route's, a group's K in its order: results agree with the other routes to float32
rounding. Thread-safe: plans are immutable; scratch is per thread (slots 0 and 1).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..common import scratch
from ..lib import gemm, gemm_cols
from ..lib.activations import PARAMS_LEN, _act_row
from ..lib.jit import CONTRACT, Jitted, frozen, jit_enabled
from . import conv_cols
from .conv_cols import GRID, _block, _crop_grid, _phase_rows
from .conv_im2col import im2col_rows

__all__ = ["MIN_CHANNELS", "GroupedColsPlan", "compile_at_build", "plan", "run", "serves",
           "taps_first"]  # fmt: skip

#: Groups of fewer input channels are left to the other routes (a product over K = a few
#: taps of a few channels is mostly the kernel's call).
MIN_CHANNELS = 4

numba: Any = None  # set by Jitted(parallel=True)


def _pair(  # pragma: no cover - numba only
    x: Any, xb: Any, w: Any, y3: Any, b: Any, res3: Any, geo: Any, blocks: Any, cols: Any,
    act: int, p: Any, lohi: Any, flags: int, nr: int, mode: int, sub: int, toff: Any,
    pads: Any, q: int,
) -> None:  # fmt: skip
    """Pair ``q`` (image ``q // groups``, group ``q % groups``; groups = ``w.shape[0]``):
    ``conv_cols._block`` over each of ``blocks`` (the one-group plan's, image 0) on
    views of the pair's input planes, filters, bias and output (and residual) runs."""
    groups, mg = w.shape[0], w.shape[1]
    i, g = q // groups, q % groups
    _n, c_in, h, wd = x.shape
    cg = c_in // groups
    o = y3.shape[2]
    x0 = (i * c_in + g * cg) * h * wd
    xg = x.reshape(-1)[x0 : x0 + cg * h * wd].reshape((1, cg, h, wd))
    y0 = (i * y3.shape[1] + g * mg) * o
    yg = y3.reshape(-1)[y0 : y0 + mg * o].reshape((1, mg, o))
    rg = res3
    if res3.shape[0] > 0:
        rg = res3.reshape(-1)[y0 : y0 + mg * o].reshape((1, mg, o))
    bg = b[g * mg : (g + 1) * mg]
    for k in range(blocks.shape[0]):
        _block(xg, xb, w[g], yg, bg, rg, geo, 0, blocks[k, 1], blocks[k, 2], blocks[k, 3],
               blocks[k, 4], sub, cols, act, p, lohi, flags, nr, mode, toff, pads)  # fmt: skip


def _groups_par(  # pragma: no cover - numba only
    x: Any, xpad: Any, w: Any, y3: Any, b: Any, res3: Any, geo: Any, blocks: Any,
    cols_buf: Any, act: int, p: Any, lohi: Any, flags: int, nr: int, mode: int, sub: int,
    toff: Any, pads: Any,
) -> None:  # fmt: skip
    """Every (image, group) pair in a ``prange`` loop, each with its thread's row of
    ``cols_buf`` and ``xpad`` (rows ``native_threads.max_threads()``)."""
    for q in numba.prange(x.shape[0] * w.shape[0]):
        t = numba.get_thread_id()
        _pair(x, xpad[t], w, y3, b, res3, geo, blocks, cols_buf[t], act, p, lohi, flags, nr,
              mode, sub, toff, pads, q)  # fmt: skip


def _groups_one(  # pragma: no cover - numba only
    x: Any, xpad: Any, w: Any, y3: Any, b: Any, res3: Any, geo: Any, blocks: Any,
    cols_buf: Any, act: int, p: Any, lohi: Any, flags: int, nr: int, mode: int, sub: int,
    toff: Any, pads: Any,
) -> None:  # fmt: skip
    """``_groups_par`` on the caller's thread, pair after pair, with row 0 of each
    scratch."""
    for q in range(x.shape[0] * w.shape[0]):
        _pair(x, xpad[0], w, y3, b, res3, geo, blocks, cols_buf[0], act, p, lohi, flags, nr,
              mode, sub, toff, pads, q)  # fmt: skip


def _warm(fn: Any) -> None:
    f = np.float32
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 2], np.int64)
    # two groups of one channel and one filter, weights and bias read-only as a model's
    x, w, y3 = np.ones((1, 2, 2, 2), f), frozen(np.ones((2, 1, 9), f)), np.zeros((1, 2, 4), f)
    blocks = np.array([[0, 0, 2, 0, 1]], np.int64)
    rows = max(2, native_threads.max_threads())
    for mode in (conv_cols.IM2COL, GRID):
        fn(x, np.zeros((rows, 1, 20), f), w, y3, frozen(np.zeros(2, f)), np.zeros((0, 0, 0), f),
           geo, blocks, np.zeros((rows, 18), f), 0, np.zeros(PARAMS_LEN, f), np.zeros(2, f), 0,
           gemm_cols.panel_width(), mode, 1, np.zeros(1, np.int64),
           np.array([1, 1, 4, 2, 1, 1], np.int64))  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    # the kernel for conv_cols' helpers, which run in its module's globals
    return gemm_cols.register(module_globals) and gemm_cols.register(vars(conv_cols))


_HELPERS = (im2col_rows, _act_row, _block, _crop_grid, _phase_rows, _pair)
GROUPS_PAR = Jitted(_groups_par, _warm, helpers=_HELPERS, fastmath=CONTRACT, parallel=True,
                    prepare=_prepare)  # fmt: skip
GROUPS_ONE = Jitted(_groups_one, _warm, helpers=_HELPERS, fastmath=CONTRACT, prepare=_prepare)


def serves(channels_per_group: int, groups: int, dtype: np.dtype) -> bool:
    """Whether this route takes a grouped conv of this many input channels a group: a
    float32 one of ``MIN_CHANNELS`` or more, where numba and the kernel are there (at
    load: the direct depthwise kernel, ``conv_depthwise``, takes the others)."""
    if groups < 2 or channels_per_group < MIN_CHANNELS or dtype != np.float32:
        return False
    return GROUPS_ONE.usable() and gemm_cols.available()


def compile_at_build() -> None:
    """Compile the kernels ``plan`` picks from, now, from a grouped float32 conv's builder
    (its thread), not in a model's first call of a shape (``conv_cols.compile_at_build``'s
    reason); a no-op where the compiled kernels may not run on this thread."""
    if not jit_enabled() or not gemm_cols.available():
        return
    conv_cols.COLS_ONE.get()  # a pair's plan is conv_cols' one-thread plan
    GROUPS_ONE.get()
    if intra_pool().threads > 1:
        GROUPS_PAR.get()


class GroupedColsPlan(NamedTuple):
    """How ``run`` computes one input shape (immutable)."""

    fn: Any  # GROUPS_PAR's or GROUPS_ONE's compiled function
    cols: conv_cols.ColsPlan  # the plan of one pair: one image, one group's channels
    rows: int  # scratch rows: native_threads.max_threads(), or 1 on the caller
    zeros: np.ndarray  # M zeros: the bias when there is none


def plan(
    x_shape: tuple[int, ...], m: int, groups: int, kernel: tuple[int, int],
    out_shape: tuple[int, ...], strides: tuple[int, ...], pads_begin: tuple[int, ...],
    dilations: tuple[int, ...], act: int, params: np.ndarray, threads: int,
) -> GroupedColsPlan | None:  # fmt: skip
    """The plan of a grouped float32 2-D conv of ``m`` filters in ``groups`` groups (as
    ``conv_cols.plan``'s arguments), over ``threads`` native threads where its product
    is big enough to split; None where it does not serve (module doc)."""
    n, c, h, w = x_shape
    if groups < 2 or c % groups or m % groups or c // groups < MIN_CHANNELS:
        return None
    cg, mg = c // groups, m // groups
    oh, ow = out_shape[2], out_shape[3]
    # strided: over the input's phases whatever the rows' width (one Zen 4 thread,
    # 400x14x14 3x3/2 in 25 groups 219 -> 175 µs, 160x28x28 in 10 220 -> 185)
    cp = conv_cols.plan((1, cg, h, w), mg, kernel, (1, mg, oh, ow), strides, pads_begin,
                        dilations, act, params, 1, phase_min_width=0)  # fmt: skip
    if cp is None:
        return None
    macs = n * m * cg * kernel[0] * kernel[1] * oh * ow
    split = threads > 1 and n * groups > 1 and macs >= gemm.NATIVE_SPLIT_MIN_MACS
    fn = (GROUPS_PAR if split else GROUPS_ONE).get()
    if fn is None:
        return None
    rows = native_threads.max_threads() if split else 1
    return GroupedColsPlan(fn, cp, rows, frozen(np.zeros(m, np.float32)))


def run(
    gp: GroupedColsPlan, x: np.ndarray, w: np.ndarray, y3: np.ndarray, b: np.ndarray | None,
    res3: np.ndarray | None, geo: np.ndarray, params: np.ndarray,
) -> None:  # fmt: skip
    """``y3`` (N, M, OH*OW) = the grouped conv of ``x`` (C-contiguous float32 (N, C, H, W))
    by ``w`` ((groups, M/groups, K); GRID: ``taps_first``'s), + ``b`` + ``res3``, then
    ReLU/Clip or the plan's compiled activation. The caller has entered numba's threads
    (``native_threads.enter``) where the plan splits."""
    cp = gp.cols
    cols = scratch(1, (gp.rows, max(1, cp.scratch_floats)), x.dtype)
    xpad_tail = cp.xpad_shape[1:] if cp.mode == GRID else (1, 1)
    xpad = scratch(0, (gp.rows, *xpad_tail), x.dtype)
    conv_cols.run(cp, x, w, y3, b, res3, geo, params, cols, xpad, fn=gp.fn, zeros=gp.zeros)


def taps_first(w: np.ndarray, groups: int) -> np.ndarray:
    """Weights (M, C/groups, KH, KW) as GRID's operand a group: (groups, M/groups,
    KH*KW*C/groups), float32, read-only."""
    m = w.shape[0]
    t = conv_cols.taps_first(w)  # (M, taps*cg): a filter's taps, each its group's channels
    out = np.ascontiguousarray(t.reshape(groups, m // groups, -1))
    out.flags.writeable = False
    return out
