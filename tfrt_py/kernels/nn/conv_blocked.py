"""A 2-D convolution as blocks, each one im2col + GEMM + epilogue while its columns are
still in cache, the blocks run on tfrt_py's intra-op pool.

The whole-image path (``conv.make_conv_core``) zero-pads the input, copies the whole
im2col matrix (K = C*KH*KW rows by OH*OW columns, megabytes for a ResNet stage), multiplies,
then adds the bias and applies the activation in another pass: three passes over memory
that does not fit in cache, on one thread while the other waits (a grouped conv's stacked
product included). Here one block -- output rows ``[oh0, oh1)`` of one image for a
one-group conv, groups ``[g0, g1)`` of one image for a grouped one -- is one part:

1. ``conv_im2col.im2col_rows`` (compiled) writes the block's im2col columns straight from the
   unpadded input, zeros where a tap falls in the padding (no padded copy; a 1x1
   stride-1 conv reads the input itself; a column stride of 2 over wide rows first
   splits each channel into its even and odd columns, so every tap copies a contiguous
   run instead of gathering every other element);
2. ``np.matmul`` of the weights by those columns into the block of ``y`` (single-threaded
   BLAS; a strided ``out`` of unit inner stride is BLAS-able, no copy);
3. ``conv_direct._epilogue_cols`` (compiled) adds the bias and the residual and applies
   the activation to the block while it is in cache (Sigmoid/SiLU: over ``y`` after).

The parts are independent (each writes only its block of ``y``) and run on
``concurrency.threads``' intra-op pool with the caller taking part; the im2col columns
live in the running thread's scratch slot 1. Sums are BLAS's over the same K as the
whole-image GEMM, so results match it to rounding.

``plan_blocked`` returns None (the caller keeps the whole-image path) without numba, for
dtypes other than float32/float64 and for other ranks; ``conv_blocked_fn.blocked_conv_fn``
(the node-level function ``conv`` calls) also leaves depthwise-like convs (fewer than
``MIN_GROUP_CHANNELS`` channels per group) and one-group convs with more filters than
output pixels to the other paths. Thread-safe: the plan is immutable; state is per-thread
scratch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..common import scratch
from ..lib import blas, gemm
from ..lib.activations import PARAMS_LEN
from ..lib.jit import CONTRACT, Jitted, frozen
from . import conv_cols, conv_cols_grouped, conv_packed
from .conv_direct import (
    _EPILOGUE_COLS,
    ACTIVATIONS,
    Epilogue,
    _act_row,
    _epilogue_row,
    _jit_act,
    _numpy_act,
    _params,
    act_fns,
    numpy_act_after,
)
from .conv_im2col import IM2COL, IM2COL_PAR, im2col_rows
from .conv_pointwise import POINTWISE_PAR, filter_blocks

__all__ = ["MIN_GROUP_CHANNELS", "BlockedPlan", "plan_blocked", "run_blocked"]

#: Convs with fewer multiply-adds than this run as one part on the caller (a hand-off to
#: a helper costs ~5-50 µs).
_SPLIT_MIN_MACS = 1 << 22
#: Grouped convs with fewer input channels per group are left to the depthwise kernel or
#: the whole-image path (a GEMM over a K of a few taps is mostly overhead).
MIN_GROUP_CHANNELS = 4
#: A 1x1 conv's product splits into filter blocks on native threads from this many
#: filters (two blocks of 32 rows; fewer filters split by output pixels on the pool).
_NATIVE_MIN_FILTERS = 64


#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles, and
#: NumPy's BLAS gemm (``blas.register``, its ``prepare``).
numba: Any = None
_sgemm: Any = None
_dgemm: Any = None


def _blocked_par(  # pragma: no cover - numba only
    x: Any, w2: Any, y3: Any, b: Any, res3: Any, geo: Any, blocks: Any, cols_buf: Any,
    act: int, p: Any, direct: bool,
) -> None:  # fmt: skip
    """A one-group conv's blocks (rows ``(image, first output row, end row)``) in a
    ``prange`` loop on native threads: per block, im2col into its row of ``cols_buf``
    (``direct``, a 1x1 stride-1 conv: the input's columns are the operand as they are),
    NumPy's BLAS gemm by ``w2`` (M, K) straight into the block of ``y3`` (N, M, OH*OW)
    (``blas``: leading dimensions, no copies), then bias (``b`` empty: none), residual
    (``res3`` empty: none) and the activation while the block is in cache. ``numba``,
    ``_sgemm`` and ``_dgemm`` are this module's globals once ``Jitted`` prepares it."""
    m, k = w2.shape
    o = y3.shape[2]
    ow = geo[8]
    has_b = b.shape[0] > 0
    has_res = res3.shape[0] > 0
    zero, one = p[2], p[3]
    sz = y3.itemsize
    c_in = x.shape[1]
    for q in numba.prange(blocks.shape[0]):
        i, r0, r1 = blocks[q, 0], blocks[q, 1], blocks[q, 2]
        p0, npx = r0 * ow, (r1 - r0) * ow
        # addresses in uint64 (uint64 + int64 would be a float64 in numba's typing)
        if direct:
            src, ldb = x.ctypes.data + np.uint64((i * c_in * o + p0) * sz), o
        else:
            cols = cols_buf[q]
            im2col_rows(x, i, cols[: k * npx].reshape((k, npx)), geo, 0, c_in, r0, r1)
            src, ldb = cols.ctypes.data, npx
        dst = y3.ctypes.data + np.uint64((i * m * o + p0) * sz)
        if sz == 4:
            _sgemm(101, 111, 111, m, npx, k, one, w2.ctypes.data, k, src, ldb, zero, dst, o)
        else:
            _dgemm(101, 111, 111, m, npx, k, one, w2.ctypes.data, k, src, ldb, zero, dst, o)
        for mm in range(m):
            row = y3[i, mm, p0 : p0 + npx]
            r = res3[i, mm, p0 : p0 + npx] if has_res else row
            _epilogue_row(row, b[mm] if has_b else zero, r, has_b, has_res, act, p)


def _warm_blocked_par(fn: Any) -> None:
    t = np.float32
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 2], np.int64)
    x, w2, y3 = np.ones((1, 1, 2, 2), t), frozen(np.ones((2, 9), t)), np.zeros((1, 2, 4), t)
    blocks = np.array([[0, 0, 1], [0, 1, 2]], np.int64)
    b, e3 = frozen(np.zeros(2, t)), np.zeros((0, 0, 0), t)  # weights, bias: a model's
    fn(x, w2, y3, b, e3, geo, blocks, np.zeros((2, 18), t), 0, np.zeros(PARAMS_LEN, t), False)


def _prepare_blocked_par(module_globals: dict[str, Any]) -> bool:
    return blas.register(module_globals)


_BLOCKED_PAR = Jitted(
    _blocked_par,
    _warm_blocked_par,
    helpers=(im2col_rows, _act_row, _epilogue_row),
    fastmath=CONTRACT,
    parallel=True,
    prepare=_prepare_blocked_par,
)


_EMPTY1 = {np.dtype(t): frozen(np.zeros(0, t)) for t in (np.float32, np.float64)}  # as a bias
_EMPTY2 = {np.dtype(t): np.zeros((0, 0), t) for t in (np.float32, np.float64)}
_EMPTY3 = {np.dtype(t): np.zeros((0, 0, 0), t) for t in (np.float32, np.float64)}
#: conv_cols' padded rows where it has none (IM2COL): one empty block
_NO_PAD = {np.dtype(t): np.zeros((1, 0, 0), t) for t in (np.float32, np.float64)}


class BlockedPlan(NamedTuple):
    """One input shape's blocked convolution, made once (immutable)."""

    im2col: Any  # compiled im2col_rows, or None for a 1x1 stride-1 unpadded conv
    epilogue: Any  # compiled conv_direct._epilogue_cols
    geo: np.ndarray  # im2col_rows' geometry
    group: int
    k: int  # im2col rows per group: C / group * KH * KW
    out_shape: tuple[int, ...]  # (N, M, OH, OW)
    # (image, first group, end group, first output row, end row): one group's blocks
    # are rows of output, a grouped conv's blocks are groups
    blocks: tuple[tuple[int, int, int, int, int], ...]
    split: bool  # run the blocks on the intra-op pool
    act: int  # the compiled activation code (0: none, or a NumPy one after)
    epi: Epilogue  # for Sigmoid/SiLU (float64 Gelu): NumPy (or compiled) over y afterwards
    params: np.ndarray
    fns: tuple[Any, Any]  # conv_direct.act_fns(epi)
    # a 1x1 conv with enough filters for blocks of filters on native threads, each with
    # its epilogue (``conv_pointwise``): the compiled kernel and its (image, m0, m1)
    # blocks; None: not this path
    native: Any = None
    native_blocks: np.ndarray | None = None
    # ... and its im2col (``_im2col_par``) with (image, c0, c1) blocks of channels, or
    # None: a 1x1 conv (no im2col) or none compiled (the caller runs it alone)
    im2col_par: Any = None
    im2col_blocks: np.ndarray | None = None
    # else, the compiled blocks on native threads (``_blocked_par``) and their
    # (image, first output row, end row) rows; None: the Python pool's path
    par: Any = None
    par_blocks: np.ndarray | None = None
    par_rows: int = 0  # the most output rows in one of them
    # a one-group float32 conv on ``conv_cols`` (the gemm_cols kernel), on native threads
    # or the caller; None: not this path
    cols: conv_cols.ColsPlan | None = None
    # a one-group float32 conv as pixel rows times the packed filters (``conv_packed``:
    # where ``conv_packed.plan`` serves), on numba's threads (one or more); None: not this
    # path
    packed: conv_packed.PackedConvPlan | None = None
    # a grouped float32 conv, each (image, group) pair on ``conv_cols``' kernel
    # (``conv_cols_grouped``); None: not this path
    grouped: conv_cols_grouped.GroupedColsPlan | None = None
    # which of ``run_blocked``'s paths runs it: "packed" (``packed``), "groups"
    # (``grouped``), "filters" (``native``), "cols" (``cols``), "rows" (``par``), "whole"
    # (one image, one group, one block on the caller) or "parts" (``blocks``, on the
    # intra-op pool when ``split``)
    route: str = "parts"


def _pool_blocks(
    n: int, group: int, oh: int, parts: int
) -> tuple[tuple[int, int, int, int, int], ...]:
    """The Python pool's blocks, ``parts`` per image: (image, first group, end group, first
    output row, end row), rows of output for one group, else groups."""
    if group == 1:
        step = -(-oh // parts)
        spans = [(0, 1, r0, min(oh, r0 + step)) for r0 in range(0, oh, step)]
    else:
        step = -(-group // parts)
        spans = [(g0, min(group, g0 + step), 0, oh) for g0 in range(0, group, step)]
    return tuple((i, *span) for i in range(n) for span in spans)


def _filter_blocks(
    n: int, c_in: int, m: int, threads: int, direct: bool
) -> tuple[Any, np.ndarray | None, Any, np.ndarray | None]:
    """(compiled kernel, its (image, m0, m1) blocks, compiled im2col or None, its (image,
    c0, c1) blocks) of the filter-block path on native threads; all None without it."""
    native = POINTWISE_PAR.get()
    if native is None:
        return None, None, None, None
    t = min(threads, native_threads.max_threads())
    native_blocks = filter_blocks(n, m, gemm.PARTS_PER_THREAD * t)
    if direct:
        return native, native_blocks, None, None
    parts = min(gemm.PARTS_PER_THREAD * t, c_in)
    im2col_blocks = np.array(
        [(i, c_in * j // parts, c_in * (j + 1) // parts) for i in range(n) for j in range(parts)],
        np.int64,
    )
    return native, native_blocks, IM2COL_PAR.get(), im2col_blocks


#: BLAS's speed on a few-pixel conv's product (filters x K @ K x pixels) as a share of
#: conv_cols' kernel's, by output pixels: OpenBLAS's SkylakeX sgemm on a 2-core Zen 4, one
#: thread (2026-12-02): 57-61 GFLOP/s at 49 pixels, 75-80 at 169 and 196, where the kernel
#: ran at ~100 on whole panels.
_BLAS_SHARE_FEW, _BLAS_SHARE = 0.6, 0.8
_FEW = 64


def _cols_pays(cp: conv_cols.ColsPlan, oh: int, ow: int) -> bool:
    """Whether conv_cols' plan ``cp`` beats BLAS on a conv with more filters than pixels:
    the columns its kernel computes (extended rows and partial panels included) against
    the pixels at BLAS's share of its speed. 512x7x7 3x3: 64 columns against 49 / 0.6
    (cols: 25% faster, measured); 13x13: 224 against 169 / 0.8 (BLAS: 6-15% faster)
    before rows shared their padding, 192 since (cols: 11-20% faster, one Zen 5 thread
    and two); 256x14x14: 224 against 196 / 0.8 (cols: 13-15% faster)."""
    pixels = oh * ow
    share = _BLAS_SHARE_FEW if pixels < _FEW else _BLAS_SHARE
    return conv_cols.computed_columns(cp, oh, ow) * share <= pixels


def _native_threads(threads: int) -> int:
    """The threads a plan made now may split over on native threads: ``threads`` capped at
    numba's, 1 where they are not there. Sets them up first (``max_threads`` reads 1 until
    then: a model whose first parallel kernel was this conv planned it serial)."""
    return min(threads, native_threads.max_threads()) if native_threads.ready() else 1


def _row_blocks(n: int, oh: int, threads: int) -> tuple[Any, np.ndarray | None, int]:
    """(compiled ``_blocked_par``, its (image, first output row, end row) blocks, the most
    rows in one) for the row-block path on native threads; (None, None, 0) without it."""
    par = _BLOCKED_PAR.get()
    if par is None:
        return None, None, 0
    t = min(threads, native_threads.max_threads(), oh)  # a block of rows per thread per image
    rows = [(oh * j // t, oh * (j + 1) // t) for j in range(t)]
    par_blocks = np.array([(i, r0, r1) for i in range(n) for r0, r1 in rows], np.int64)
    return par, par_blocks, -(-oh // t)


def plan_blocked(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    out_shape: tuple[int, ...],
    strides: tuple[int, ...],
    pads_begin: tuple[int, ...],
    dilations: tuple[int, ...],
    dtype: np.dtype,
    epi: Epilogue,
) -> BlockedPlan | None:
    """The blocked plan for a 2-D conv of these shapes (``w_shape`` (M, C/group, KH, KW)),
    or None (module doc)."""
    if len(x_shape) != 4 or dtype not in _EMPTY1 or epi.act not in ACTIVATIONS:
        return None
    if not (IM2COL.usable() and _EPILOGUE_COLS.usable()):
        return None
    n = x_shape[0]
    m, cg, kh, kw = w_shape
    group = x_shape[1] // cg
    oh, ow = out_shape[2], out_shape[3]
    direct = (
        kh == kw == 1 and tuple(strides) == (1, 1) and not any(pads_begin)
        and x_shape[2:] == out_shape[2:]
    )  # fmt: skip
    k = cg * kh * kw
    macs = n * m * k * oh * ow
    threads = intra_pool().threads
    split = threads > 1 and macs >= _SPLIT_MIN_MACS
    # gemm.PARTS_PER_THREAD blocks per thread per image; cache-sized blocks measured
    # slower too: each block packs the weights again and BLAS packs its own panels
    blocks = _pool_blocks(n, group, oh, gemm.PARTS_PER_THREAD * threads if split else 1)
    geo = np.array(
        [kh, kw, strides[0], strides[1], dilations[0], dilations[1], pads_begin[0],
         pads_begin[1], ow],
        np.int64,
    )  # fmt: skip
    native_size = group == 1 and threads > 1 and macs >= gemm.NATIVE_SPLIT_MIN_MACS
    native, native_blocks, im2col_par, im2col_blocks = None, None, None, None
    cols = None
    one_f32 = dtype == np.float32 and group == 1
    act, params = _jit_act(epi, dtype), _params(epi, dtype)
    packed = None
    pointwise_few = kh * kw == 1 and conv_packed.pointwise_pays(m, oh * ow)
    if one_f32 and (kh * kw > 1 or pointwise_few) and macs >= gemm.NATIVE_SPLIT_MIN_MACS:
        packed = conv_packed.plan(x_shape, m, (kh, kw), out_shape, strides, pads_begin,
                                  dilations, act, params, _native_threads(threads))  # fmt: skip
    if packed is None and native_size and m >= _NATIVE_MIN_FILTERS and (direct or m > oh * ow):
        # filter blocks: a 1x1 conv as it is; a conv with more filters than output
        # pixels (row blocks would be a few pixels wide): conv_cols' blocks (the weights
        # and a 1x1 conv's input read as they are), else BLAS's after one im2col per image
        if one_f32:
            cols = conv_cols.plan(x_shape, m, (kh, kw), out_shape, strides, pads_begin,
                                  dilations, act, params,
                                  _native_threads(threads))  # fmt: skip
            if cols is not None and not _cols_pays(cols, oh, ow):
                cols = None
        if cols is None:
            native, native_blocks, im2col_par, im2col_blocks = _filter_blocks(
                n, x_shape[1], m, threads, direct
            )
    whole = n == 1 and group == 1 and not (split and len(blocks) > 1)
    grouped = None
    if dtype == np.float32 and group > 1:
        grouped = conv_cols_grouped.plan(x_shape, m, group, (kh, kw), out_shape, strides,
                                         pads_begin, dilations, act, params,
                                         _native_threads(threads))  # fmt: skip
    if packed is not None:
        route = "packed"
    elif grouped is not None:
        route = "groups"
    elif cols is not None:
        route = "cols"
    elif native is not None:
        route = "filters"
    elif native_size and _BLOCKED_PAR.usable():
        route = "rows"  # from NATIVE_SPLIT_MIN_MACS: below the pool's _SPLIT_MIN_MACS too
    else:
        route = "whole" if whole else "parts"
    serial = route == "whole" or (route == "parts" and not (split and len(blocks) > 1))
    if cols is None and packed is None and one_f32 and (route == "rows" or serial):
        cols_threads = 1 if serial else _native_threads(threads)
        cols = conv_cols.plan(x_shape, m, (kh, kw), out_shape, strides, pads_begin, dilations,
                              act, params, cols_threads)  # fmt: skip
        if cols is not None and m > oh * ow and not _cols_pays(cols, oh, ow):
            cols = None
        route = route if cols is None else "cols"
    par, par_blocks, par_rows = None, None, 0
    if route == "rows":  # compiled only for a conv that takes it (not one "cols" took)
        par, par_blocks, par_rows = _row_blocks(n, oh, threads)
        if par is None:  # it failed to compile
            route = "whole" if whole else "parts"
    # the serial im2col and epilogue: compiled now for the routes that call them, on their
    # first call for the others (which fall back to them only in corner cases)
    blas_route = route in ("whole", "parts")
    im2col_now = blas_route or (
        route == "filters" and (im2col_par is None or im2col_blocks is None)
    )
    im2col = IM2COL.get() if im2col_now and not direct else IM2COL.lazy()
    epilogue = _EPILOGUE_COLS.get() if blas_route else _EPILOGUE_COLS.lazy()
    if im2col is None or epilogue is None:
        return None
    return BlockedPlan(
        im2col=None if direct else im2col, epilogue=epilogue, geo=geo, group=group, k=k,
        out_shape=(n, m, oh, ow), blocks=blocks, split=split and len(blocks) > 1,
        act=act, epi=epi if numpy_act_after(epi, dtype) else Epilogue(),
        params=params, fns=act_fns(epi), native=native, native_blocks=native_blocks,
        im2col_par=im2col_par, im2col_blocks=im2col_blocks, par=par, par_blocks=par_blocks,
        par_rows=par_rows, cols=cols, packed=packed, grouped=grouped, route=route,
    )  # fmt: skip


def _run_filters(
    plan: BlockedPlan, x: np.ndarray, w2: np.ndarray, y: np.ndarray, bb: np.ndarray,
    res: np.ndarray | None,
) -> np.ndarray:  # fmt: skip
    """``run_blocked``'s "filters" route: blocks of filters on native threads, each block's
    epilogue on the thread that computed it (``conv_pointwise``), over the input (1x1) or
    its im2col columns."""
    dt = x.dtype
    n, m, oh, ow = plan.out_shape
    o = oh * ow
    native_threads.enter(intra_pool().threads)
    if plan.im2col is None:
        src = x.reshape(n, x.shape[1], o)
    else:
        src = scratch(1, (n, plan.k, o), dt)
        if plan.im2col_par is not None and plan.im2col_blocks is not None:
            plan.im2col_par(x, src, plan.geo, plan.im2col_blocks)
        else:
            for i in range(n):
                plan.im2col(x, i, src[i], plan.geo, 0, x.shape[1], 0, oh)
    r3n = _EMPTY3[dt] if res is None else res.reshape(n, m, o)
    plan.native(src, w2, y.reshape(n, m, o), bb, r3n, plan.native_blocks, plan.act,
                plan.params)  # fmt: skip
    if plan.epi.act:
        _numpy_act(y, plan.epi, plan.fns)
    return y


def _run_rows(
    plan: BlockedPlan, blocks: np.ndarray, x: np.ndarray, w2: np.ndarray, y: np.ndarray,
    bb: np.ndarray, res: np.ndarray | None,
) -> np.ndarray:  # fmt: skip
    """``run_blocked``'s "rows" route: ``_blocked_par`` over ``blocks`` (``plan.par_blocks``)
    of output rows on native threads."""
    dt = x.dtype
    n, m, oh, ow = plan.out_shape
    o = oh * ow
    direct = plan.im2col is None
    cols = scratch(1, (len(blocks), 0 if direct else plan.k * plan.par_rows * ow), dt)
    r3n = _EMPTY3[dt] if res is None else res.reshape(n, m, o)
    native_threads.enter(intra_pool().threads)
    plan.par(x, w2, y.reshape(n, m, o), bb, r3n, plan.geo, blocks, cols, plan.act,
             plan.params, direct)  # fmt: skip
    if plan.epi.act:
        _numpy_act(y, plan.epi, plan.fns)
    return y


def _run_cols(
    plan: BlockedPlan, cp: conv_cols.ColsPlan, x: np.ndarray, w2: np.ndarray, y: np.ndarray,
    bb: np.ndarray, res: np.ndarray | None, w_taps: np.ndarray | None,
) -> np.ndarray:  # fmt: skip
    """``run_blocked``'s "cols" route (``conv_cols``): blocks of output rows on native
    threads or the caller, sub-block by sub-block; ``w_taps``: the weights as
    ``conv_cols.taps_first`` gives them (made here when None and GRID needs them)."""
    n, m, oh, ow = plan.out_shape
    o = oh * ow
    cols = scratch(1, (cp.rows, max(1, cp.scratch_floats)), x.dtype)
    if cp.mode == conv_cols.GRID:
        xpad = scratch(0, cp.xpad_shape, x.dtype)
        if w_taps is None:  # direct callers (a 1x1 conv's taps-first weights are its weights)
            kh, kw = int(plan.geo[0]), int(plan.geo[1])
            w_taps = w2 if kh * kw == 1 else conv_cols.taps_first(w2.reshape(m, -1, kh, kw))
        w2 = w_taps
    else:
        xpad = _NO_PAD[x.dtype]
    if cp.parallel:
        native_threads.enter(intra_pool().threads)
    conv_cols.run(cp, x, w2, y.reshape(n, m, o), bb, None if res is None else res.reshape(n, m, o),
                  plan.geo, plan.params, cols, xpad)  # fmt: skip
    if plan.epi.act:
        _numpy_act(y, plan.epi, plan.fns)
    return y


def _run_packed(
    plan: BlockedPlan, pp: conv_packed.PackedConvPlan, x: np.ndarray, w3: np.ndarray,
    y: np.ndarray, bb: np.ndarray, res: np.ndarray | None, w_packed: np.ndarray | None,
) -> np.ndarray:  # fmt: skip
    """``run_blocked``'s "packed" route (``conv_packed``); ``w_packed``: the filters as
    ``conv_packed.pack_filters`` gives them (made here when None)."""
    n, m, oh, ow = plan.out_shape
    o = oh * ow
    if w_packed is None:  # direct callers
        kh, kw = int(plan.geo[0]), int(plan.geo[1])
        w_packed = conv_packed.pack_filters(w3[0].reshape(m, -1, kh, kw))
        if w_packed is None:  # the kernel went away since the plan (it never does)
            raise RuntimeError("the packed gemm kernel is not there for a planned conv")
    native_threads.enter(intra_pool().threads)
    conv_packed.run(pp, x, w_packed, y.reshape(n, m, o), bb,
                    None if res is None else res.reshape(n, m, o), plan.params)  # fmt: skip
    if plan.epi.act:
        _numpy_act(y, plan.epi, plan.fns)
    return y


def _run_groups(
    plan: BlockedPlan, gp: conv_cols_grouped.GroupedColsPlan, x: np.ndarray, w3: np.ndarray,
    y: np.ndarray, bb: np.ndarray, res: np.ndarray | None, w_taps: np.ndarray | None,
) -> np.ndarray:  # fmt: skip
    """``run_blocked``'s "groups" route (``conv_cols_grouped``); ``w_taps``: the weights
    as ``conv_cols_grouped.taps_first`` gives them (made here when None and GRID needs
    them)."""
    n, m, oh, ow = plan.out_shape
    w = w3
    if gp.cols.mode == conv_cols.GRID:
        if w_taps is None:  # direct callers
            kh, kw = int(plan.geo[0]), int(plan.geo[1])
            w_taps = conv_cols_grouped.taps_first(w3.reshape(m, -1, kh, kw), plan.group)
        w = w_taps
    if gp.rows > 1:
        native_threads.enter(intra_pool().threads)
    conv_cols_grouped.run(gp, x, w, y.reshape(n, m, oh * ow), bb,
                          None if res is None else res.reshape(n, m, oh * ow), plan.geo,
                          plan.params)  # fmt: skip
    if plan.epi.act:
        _numpy_act(y, plan.epi, plan.fns)
    return y


def run_blocked(
    plan: BlockedPlan,
    x: np.ndarray,
    w3: np.ndarray,
    b: np.ndarray | None,
    res: np.ndarray | None,
    out: np.ndarray | None,
    w_taps: np.ndarray | None = None,
    w_packed: np.ndarray | None = None,
) -> np.ndarray:
    """The convolution of ``x`` (C-contiguous (N, C, H, W), the plan's dtype) by ``w3``
    (group, M/group, K), plus ``b`` (M,) and ``res`` (N, M, OH, OW C-contiguous), then the
    activation, into ``out`` (C-contiguous) or a new array. ``w_taps``: the same weights
    as ``conv_cols.taps_first`` orders them, made once by the caller (else per call where
    the "cols" route needs them); ``w_packed`` likewise ``conv_packed.pack_filters``' for
    the "packed" route. The caller's thread takes part in the blocks; helpers of the
    intra-op pool take the rest."""
    dt = x.dtype
    n, m, oh, ow = plan.out_shape
    o = oh * ow
    y = np.empty(plan.out_shape, dt) if out is None else out
    bb = _EMPTY1[dt] if b is None else b
    route = plan.route
    if route == "packed" and plan.packed is not None:
        return _run_packed(plan, plan.packed, x, w3, y, bb, res, w_packed)
    if route == "groups" and plan.grouped is not None:
        return _run_groups(plan, plan.grouped, x, w3, y, bb, res, w_taps)
    if route == "filters" and plan.native_blocks is not None:
        return _run_filters(plan, x, w3[0], y, bb, res)
    if route == "cols" and plan.cols is not None:
        return _run_cols(plan, plan.cols, x, w3[0], y, bb, res, w_taps)
    if route == "rows" and plan.par_blocks is not None:
        return _run_rows(plan, plan.par_blocks, x, w3[0], y, bb, res)
    if route == "whole":
        # one image, one group, one block (most convs of a small net at batch 1): the
        # block straight, without the closures and views of the general path (~6 µs)
        y2 = y.reshape(m, o)
        if plan.im2col is None:
            cols = x.reshape(x.shape[1], o)
        else:
            cols = scratch(1, (plan.k, o), dt)
            plan.im2col(x, 0, cols, plan.geo, 0, x.shape[1], 0, oh)
        np.matmul(w3[0], cols, out=y2)
        r2 = _EMPTY2[dt] if res is None else res.reshape(m, o)
        plan.epilogue(y2, bb, r2, 0, o, plan.act, plan.params)
        if plan.epi.act:
            _numpy_act(y, plan.epi, plan.fns)
        return y
    y3 = y.reshape(n, m, o)
    r3 = None if res is None else res.reshape(n, m, o)
    im2col, epilogue, geo, k = plan.im2col, plan.epilogue, plan.geo, plan.k
    act, params, mm = plan.act, plan.params, np.matmul
    mg, cg = m // plan.group, x.shape[1] // plan.group
    x3 = x.reshape(x.shape[0], x.shape[1], -1) if im2col is None else None

    def part(blk: tuple[int, int, int, int, int]) -> Any:
        i, g0, g1, r0, r1 = blk
        p0, p1 = r0 * ow, r1 * ow
        m0, m1 = g0 * mg, g1 * mg
        yi = y3[i, m0:m1]  # C-contiguous: whole rows of whole images
        bi = bb[m0:m1] if bb.shape[0] else bb
        ri = _EMPTY2[dt] if r3 is None else r3[i, m0:m1]
        ng = g1 - g0

        def run() -> None:
            if x3 is not None:
                cols = x3[i, g0 * cg : g1 * cg, p0:p1]
            else:
                cols = scratch(1, (ng * k, p1 - p0), dt)
                im2col(x, i, cols, geo, g0 * cg, g1 * cg, r0, r1)
            if ng == 1:
                mm(w3[g0], cols, out=yi[:, p0:p1])
            else:  # whole rows: p0, p1 = 0, OH * OW
                mm(w3[g0:g1], cols.reshape(ng, k, o), out=yi.reshape(ng, mg, o))
            epilogue(yi, bi, ri, p0, p1, act, params)

        return run

    parts = [part(blk) for blk in plan.blocks]
    if plan.split:
        intra_pool().run(parts)
    else:
        for p in parts:
            p()
    if plan.epi.act:
        _numpy_act(y, plan.epi, plan.fns)
    return y
