"""A one-group or grouped 2-D conv with constant weights on ``conv_blocked``'s routes: the
node-level function ``conv`` calls (``blocked_conv_fn``), which plans each input shape once
and holds the weights in the forms the routes read.

The weights are kept as (groups, filters, taps) for the BLAS routes; the taps-first copy
``conv_cols``' GRID form reads and the packed copy of ``conv_packed``'s route are made on
the first plan that takes their route, so a conv holds only the copies its shapes use.
Thread-safe: the plans are memoized per shape (two threads planning one shape at once make
equal plans, one is kept); the weight copies likewise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..common import ShapeMemo
from ..lib import gemm_cols
from ..lib.jit import frozen
from . import conv_blocked, conv_cols, conv_cols_grouped, conv_packed
from .conv_blocked import MIN_GROUP_CHANNELS
from .conv_common import ConvNode, bias_vector, conv_geometry
from .conv_direct import _EPILOGUE_COLS
from .conv_im2col import IM2COL

__all__ = ["blocked_conv_fn"]


def blocked_conv_fn(node: ConvNode) -> Callable[..., np.ndarray | None] | None:
    """``fn(x, b, r, out)`` running the blocked conv for a one-group 2-D conv with constant
    weights, or None when it cannot apply; ``fn`` itself returns None for an input shape
    or call the whole-image path serves better or alone: more output channels than output
    pixels (each block would pack the whole weight matrix again), an input of another
    dtype, a residual of another shape, negative pads (``conv_cols``' kernel, which reads
    the weights as they are, or filter blocks on native threads, ``conv_pointwise``, take
    the first case when they are there)."""
    sp, group, w_const, b_c, cdt, epi = node
    if w_const is None or w_const.ndim != 4 or cdt not in (np.float32, np.float64):
        return None
    if (
        group < 1
        or w_const.shape[0] % group
        or (group > 1 and w_const.shape[1] < MIN_GROUP_CHANNELS)
    ):
        return None
    if not (IM2COL.usable() and _EPILOGUE_COLS.usable()):
        return None
    # read-only whatever the initializer was (a folded constant is writable): the compiled
    # kernels are warmed for read-only weights, and numba compiles the writable ones apart
    w3 = frozen(np.ascontiguousarray(w_const.reshape(group, w_const.shape[0] // group, -1),
                                     dtype=cdt))  # fmt: skip
    # the filters taps-first for conv_cols' stride-1 form (GRID; a 1x1 conv's taps-first
    # weights are its weights) and packed for the "packed" route: each a copy of the
    # weights, made on the first plan that takes its route, so a conv that only ever takes
    # one route holds one (two threads making one at once make equal arrays)
    grid = group == 1 and cdt == np.float32 and w_const.shape[2:] != (1, 1)
    w_taps: list[np.ndarray] = []
    w_packed: list[np.ndarray | None] = []
    if group == 1 and cdt == np.float32:
        gemm_cols.available()  # its kernel built (or loaded) at load, not on a first call
    w_shape = tuple(w_const.shape)
    plans: ShapeMemo[tuple[int, ...], conv_blocked.BlockedPlan | None] = ShapeMemo()

    def plan_for(shape: tuple[int, ...]) -> conv_blocked.BlockedPlan | None:
        if len(shape) != 4 or shape[1] != w_shape[1] * group or not w_shape[1] or not w_shape[0]:
            return None  # (no channels or filters: NumPy's product gives the bias)
        kernel, strides, dil, pads = sp.resolve(w_shape[2:])
        begin, end, out_sp = conv_geometry(shape[2:], kernel, strides, dil, pads, sp.auto_pad)
        if min(begin + end) < 0 or min(out_sp) < 1:
            return None
        out_shape = (shape[0], w_shape[0], *out_sp)
        plan = conv_blocked.plan_blocked(shape, w_shape, out_shape, strides, begin, dil, cdt, epi)
        if plan is not None and plan.route == "packed" and not w_packed:
            w_packed.append(conv_packed.pack_filters(w_const))
        cp = None if plan is None else plan.cols
        if grid and cp is not None and cp.mode == conv_cols.GRID and not w_taps:
            w_taps.append(conv_cols.taps_first(w_const))
        gp = None if plan is None else plan.grouped
        if gp is not None and gp.cols.mode == conv_cols.GRID and not w_taps:
            w_taps.append(conv_cols_grouped.taps_first(w_const, group))
        few_pixels = group == 1 and w_shape[0] > out_sp[0] * out_sp[1]
        blas_blocks = (
            plan is not None and plan.native is None and plan.cols is None and plan.packed is None
        )
        return None if blas_blocks and few_pixels else plan

    def blocked(x: np.ndarray, b: Any, r: Any, out: Any) -> np.ndarray | None:
        if x.shape in plans:
            plan = plans[x.shape]
        else:
            plan = plans.put(x.shape, plan_for(x.shape))
        if plan is None or x.dtype != cdt:
            return None
        if r is not None and (r.shape != plan.out_shape or r.dtype != cdt):
            return None
        bb = bias_vector(b, b_c, cdt)
        direct = out is not None and out.flags.c_contiguous
        y = conv_blocked.run_blocked(
            plan,
            x if x.flags.c_contiguous else np.ascontiguousarray(x),
            w3,
            bb,
            None if r is None else np.ascontiguousarray(r),
            out if direct else None,
            w_taps[0] if w_taps else None,
            w_packed[0] if w_packed else None,
        )
        if out is not None and not direct:
            out[...] = y
            return out
        return y

    return blocked
