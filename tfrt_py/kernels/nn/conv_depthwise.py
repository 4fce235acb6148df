"""The direct depthwise convolution's Python side (helper of ``conv``): which convs take it
(depthwise, and grouped ones with at most ``GROUPED_DIRECT_MAX_CHANNELS`` input channels
per group), its per-shape plan, and the split of groups or images over tfrt_py's intra-op
threads.
The compiled loop itself (``_depthwise2d``, polyphase on an extended grid, epilogue
included) lives in ``conv_direct`` beside the other loops that call ``_act_row`` (numba's
disk cache keys a function by its own file); its table, ``conv_common.depthwise_plan``.
Float32 depthwise convs with "same" padding (3x3, 5x5, 7x7 at stride 1; 3x3, 5x5 at
stride 2) take ``conv_depthwise_grid``'s LLVM IR kernel first, where it is built
(``grid_kind``). Otherwise (float64, a channel multiplier, no vector kernel) 3x3 convs
with one pixel of padding at stride 1 on big planes read the input directly
(``conv_depthwise3``), and 3x3 (on planes up to ``SAME_3X3_MAX_PIXELS``), 5x5 and 7x7
ones with "same" padding at stride 1, and 3x3 and 5x5 ones at stride 2, keep every
output's taps in a register (``conv_depthwise_same``).

``depthwise_conv_fn`` is to ``conv`` what ``conv_blocked_fn.blocked_conv_fn`` is: ``fn(x, b,
r, out)`` or None. Thread-safe: plans are immutable; state is per-thread scratch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..common import ShapeMemo, scratch_rows
from ..lib import depthwise_ir
from . import conv_cols_grouped, conv_depthwise3, conv_depthwise_grid, conv_depthwise_same
from .conv_common import ConvNode, bias_vector, conv_geometry, depthwise_plan, scratch
from .conv_direct import (
    _DEPTHWISE,
    _DEPTHWISE_PAR,
    _EMPTY,
    Epilogue,
    _jit_act,
    _numpy_act,
    _params,
    act_fns,
    numpy_act_after,
)

__all__ = [
    "DEPTHWISE_NATIVE_SPLIT_MIN_MACS",
    "DEPTHWISE_SPLIT_MIN_MACS",
    "GROUPED_DIRECT_MAX_CHANNELS",
    "SAME_3X3_MAX_PIXELS",
    "DepthwisePlan",
    "depthwise_conv_fn",
    "grid_kind",
    "plan_depthwise",
    "run_depthwise",
]

#: Grouped convs with at most this many input channels per group run the direct kernel
#: (each output channel a few passes of its group's taps over the grid) instead of
#: im2col + a product per group, whose fixed costs dominate at these sizes -- but float32
#: ones of ``conv_cols_grouped.MIN_CHANNELS`` or more, which take a product a group on
#: ``conv_cols``' kernel where it is there (``conv_cols_grouped.serves``).
GROUPED_DIRECT_MAX_CHANNELS = 16

#: A depthwise conv of at least this many multiply-adds (grid x taps x channels x images)
#: is split over tfrt_py's intra-op threads, by channel blocks (one image) or images.
DEPTHWISE_SPLIT_MIN_MACS = 1 << 20
#: ... and from this many on native threads (``concurrency.native_threads``: ~4 µs a
#: split, no GIL): 576x14x14 at stride 2 (~0.4M, 118 µs on one thread) took 77 µs so.
DEPTHWISE_NATIVE_SPLIT_MIN_MACS = 1 << 17


#: 3x3 stride-1 convs take ``conv_depthwise_same``'s kernel up to this many input pixels a
#: channel, ``conv_depthwise3``'s above (measured equal at 56x56: 187 against 198 µs for
#: 144 channels; larger planes unmeasured with it). 2-core AMD EPYC Zen 4, one thread, µs:
#: 960x7x7 34/96, 576x14x14 53/99, 192x28x28 65/79.
SAME_3X3_MAX_PIXELS = 56 * 56

_NO_TABLE = np.zeros(1, np.int64)  # conv_depthwise3's kernels take no table


class DepthwisePlan(NamedTuple):
    """Everything ``run_depthwise`` needs for one input shape, made once."""

    fn: Any  # the compiled kernel
    fns: tuple[Any, Any]  # act_fns(epi)
    tab: np.ndarray
    xp_len: int
    acc_len: int
    act: int
    params: np.ndarray
    split: bool  # big enough to split over the intra-op threads (when there are several)
    numpy_after: bool  # the activation runs in NumPy over the output afterwards
    par: Any  # the kernel over blocks in a native parallel loop, or None (Python pool)


def plan_depthwise(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    out_shape: tuple[int, ...],
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
    dilations: tuple[int, int],
    epi: Epilogue,
    dtype: np.dtype,
) -> DepthwisePlan | None:
    """The plan of a 2-D depthwise or grouped conv (``w`` (M, CG, KH, KW), CG input
    channels per group) for one input shape, or None when the compiled kernel is
    unavailable (numba missing or ``$TFRT_PY_JIT=0``) or the dtype is not
    float32/float64: the caller runs im2col, which is faster than any NumPy formulation
    of the direct loop we measured."""
    if dtype not in _EMPTY or len(x_shape) != 4 or not _DEPTHWISE.usable():
        return None
    n, cg = x_shape[0], w_shape[1]
    blocks = max(n, x_shape[1] // cg) >= 2
    direct = None  # 3x3, one pixel of padding: straight from the input, no scratch
    tab, xp_len, acc_len = _NO_TABLE, 0, 0
    k_same = conv_depthwise_same.fits(x_shape, w_shape, strides, pads, dilations)
    k_s2 = conv_depthwise_same.fits(x_shape, w_shape, strides, pads, dilations, stride=2)
    kind = grid_kind(x_shape, w_shape, strides, pads, dilations, dtype)
    if kind >= 0 and not depthwise_ir.ready(  # the kind's functions for this epilogue
        kind, conv_depthwise_grid.store_code(epi),
        bool(conv_depthwise_grid.table(kind, w_shape[2], out_shape)[3]),
    ):  # fmt: skip
        kind = -1
    if kind >= 0:  # the vector kernel (depthwise_ir), rows read in place
        direct = conv_depthwise_grid.GRID, conv_depthwise_grid.GRID_PAR
        tab = conv_depthwise_grid.table(kind, w_shape[2], out_shape)
        xp_len = conv_depthwise_grid.scratch_len(x_shape, out_shape)
    elif k_same and (k_same > 3 or x_shape[2] * x_shape[3] <= SAME_3X3_MAX_PIXELS):
        direct = conv_depthwise_same.kernels(k_same)  # every tap in a register
        tab = conv_depthwise_same.masks(x_shape[2], x_shape[3], k_same)
        xp_len = conv_depthwise_same.scratch_len(x_shape[2], x_shape[3], k_same)
    elif k_s2:  # the same at stride 2, over the input's four phase planes
        direct = conv_depthwise_same.kernels(k_s2, 2)
        tab = conv_depthwise_same.masks_s2(x_shape[2], x_shape[3], k_s2)
        xp_len = conv_depthwise_same.scratch_len_s2(x_shape[2], x_shape[3], k_s2)
    elif k_same == 3 and x_shape[2] >= 3 and x_shape[3] >= 3:  # a bigger plane
        direct = conv_depthwise3.DEPTHWISE3, conv_depthwise3.DEPTHWISE3_PAR
    if direct is not None and direct[0].usable():
        serial, par_kernel = direct
        work = out_shape[2] * out_shape[3] * w_shape[2] * w_shape[3] * w_shape[0] * n
    else:
        tab, xp_len, acc_len = depthwise_plan(
            x_shape[2:], w_shape[2:], out_shape[2:], strides, pads[:2], dilations
        )
        work = acc_len * w_shape[2] * w_shape[3] * w_shape[0] * cg * n
        serial, par_kernel = _DEPTHWISE, _DEPTHWISE_PAR
    par = par_kernel.get() if blocks and work >= DEPTHWISE_NATIVE_SPLIT_MIN_MACS else None
    split = blocks and (work >= DEPTHWISE_SPLIT_MIN_MACS or par is not None)
    # the serial form runs a plan that does not split, or one whose thread budget drops to
    # one: compiled now only for the first (a first process compiles what it calls)
    fn = serial.lazy() if split and par is not None else serial.get()
    if fn is None:
        return None
    return DepthwisePlan(
        fn, act_fns(epi), tab, xp_len * cg, acc_len, _jit_act(epi, dtype), _params(epi, dtype),
        split, numpy_act_after(epi, dtype), par,
    )  # fmt: skip


def grid_kind(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
    dilations: tuple[int, int],
    dtype: np.dtype,
) -> int:
    """``conv_depthwise_grid``'s kind for a float32 conv it serves, else -1 (where its
    vector kernel is built: ``depthwise_ir.function()``, built here once)."""
    if dtype != np.float32:
        return -1
    kind = conv_depthwise_grid.fits(x_shape, w_shape, strides, pads, dilations)
    return kind if kind >= 0 and depthwise_ir.function() is not None else -1


def run_depthwise(
    plan: DepthwisePlan,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    res: np.ndarray | None,
    epi: Epilogue,
) -> np.ndarray:
    """``out`` = act(depthwise(x, w) + b (+ res)); every array C-contiguous in the plan's
    dtype, ``b`` of length M, ``res`` None or of ``out``'s shape. Returns ``out``."""
    dt = x.dtype
    e = _EMPTY[dt] if res is None else res
    pool = intra_pool()
    if not plan.split or pool.threads == 1:
        _depthwise_block(plan, x, w, b, e, out)
        if plan.numpy_after:
            _numpy_act(out, epi, plan.fns)
        return out
    n, cg = x.shape[0], w.shape[1]
    groups = x.shape[1] // cg
    mg = w.shape[0] // groups
    if plan.par is not None:  # native threads: blocks of groups (one image) or of images
        rows = native_threads.plane_blocks(n, groups, 2 * native_threads.enter(pool.threads))
        buf = scratch_rows(0, rows.shape[0], plan.xp_len + plan.acc_len, dt)
        plan.par(x, w, b, e, out, plan.tab, plan.act, plan.params, buf, plan.xp_len, rows)
    elif n == 1:  # group blocks: every slice of an image's channels is C-contiguous
        blocks = min(2 * pool.threads, groups)
        edges = [groups * i // blocks for i in range(blocks + 1)]

        def channels(g0: int, g1: int) -> Callable[[], None]:
            c0, c1, m0, m1 = g0 * cg, g1 * cg, g0 * mg, g1 * mg
            r = e if res is None else e[:, m0:m1]
            return lambda: _depthwise_block(plan, x[:, c0:c1], w[m0:m1], b[m0:m1], r, out[:, m0:m1])

        pool.run([channels(edges[i], edges[i + 1]) for i in range(blocks)])
    else:  # image blocks
        blocks = min(2 * pool.threads, n)
        edges = [n * i // blocks for i in range(blocks + 1)]

        def images(n0: int, n1: int) -> Callable[[], None]:
            r = e if res is None else e[n0:n1]
            return lambda: _depthwise_block(plan, x[n0:n1], w, b, r, out[n0:n1])

        pool.run([images(edges[i], edges[i + 1]) for i in range(blocks)])
    if plan.numpy_after:
        _numpy_act(out, epi, plan.fns)
    return out


def _depthwise_block(
    plan: DepthwisePlan, x: np.ndarray, w: np.ndarray, b: np.ndarray, res: np.ndarray,
    out: np.ndarray,
) -> None:  # fmt: skip
    """The compiled kernel over a block of images or channels, with this thread's
    scratch buffers (any thread: the kernel releases the GIL)."""
    buf = scratch(0, (plan.xp_len + plan.acc_len,), x.dtype)  # one slot, two parts
    plan.fn(x, w, b, res, out, plan.tab, plan.act, plan.params, buf[: plan.xp_len],
            buf[plan.xp_len :], 0, x.shape[0], 0, x.shape[1] // w.shape[1])  # fmt: skip


# Every plane size takes the compiled kernel: from MobileNet's 960x7x7 (141 µs against 221
# by im2col) down to a detector head's 512x5x5 (12 µs against 167 on NumPy's tap loop;
# onnxruntime 10) and planes smaller than the kernel.


def depthwise_conv_fn(node: ConvNode) -> Callable[..., Any] | None:
    """``fn(x, b, r, out)`` running ``run_depthwise`` for a 2-D depthwise
    conv with constant weights, or None when it does not apply; ``fn`` itself returns None
    for an input shape where im2col is the better (or only) path."""
    sp, group, w_const, b_c, cdt, epi = node
    if w_const is None or w_const.ndim != 4 or group < 2:
        return None
    cg, taps = w_const.shape[1], w_const.shape[2] * w_const.shape[3]
    if cg > 1 and (cg > GROUPED_DIRECT_MAX_CHANNELS or taps == 1):
        return None  # a grouped 1x1 conv reads its input as the product's operand
    if conv_cols_grouped.serves(cg, group, np.dtype(cdt)):
        return None  # a product a group on conv_cols' kernel (RegNetX 400x7x7: 2.2x faster)
    if w_const.shape[0] % group or cdt not in (np.float32, np.float64):
        return None
    w4 = np.ascontiguousarray(w_const, dtype=cdt)
    zeros = np.zeros(w4.shape[0], cdt)
    plans: ShapeMemo[tuple[int, ...], Any] = ShapeMemo()

    def plan_for(shape: tuple[int, ...]) -> Any:
        if len(shape) != 4 or shape[1] != group * w4.shape[1]:
            return False
        kernel, strides, dil, pads = sp.resolve(w4.shape[2:])
        begin, end, out_sp = conv_geometry(shape[2:], kernel, strides, dil, pads, sp.auto_pad)
        if any(v < 0 for v in begin + end):
            return False
        out_shape = (shape[0], w4.shape[0], *out_sp)
        plan = plan_depthwise(shape, w4.shape, out_shape, strides,  # type: ignore[arg-type]
                              (*begin, *end), dil, epi, cdt)  # type: ignore[arg-type]  # fmt: skip
        return False if plan is None else (plan, out_shape)

    def depthwise(x: np.ndarray, b: Any, r: Any, out: Any) -> np.ndarray | None:
        got = plans.get(x.shape)
        if got is None:
            got = plans.put(x.shape, plan_for(x.shape))
        if got is False or x.dtype != cdt:
            return None
        plan, out_shape = got
        bb = bias_vector(b, b_c, cdt)
        if bb is None:
            bb = zeros
        if r is not None and (r.shape != out_shape or r.dtype != cdt):
            return None
        y = out if out is not None and out.flags.c_contiguous else np.empty(out_shape, cdt)
        xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        rc = None if r is None else np.ascontiguousarray(r)
        run_depthwise(plan, xc, w4, bb, y, rc, epi)
        if out is not None and y is not out:
            out[...] = y
            return out
        return y

    return depthwise
