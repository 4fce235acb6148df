"""A compiled 2-D MaxPool, separable: a max over each window's rows, then over its columns
(helper of ``pool``).

A window's max is the max over its columns of the max over its rows, so for each output row
``_max_pool2d`` first takes the elementwise max of the input rows its windows cover into
``tmp`` (one contiguous loop over the input width, written out of place: LLVM does not
vectorize an in-place select loop), then each output is the max of ``tmp`` over its
window's columns. Rows and columns in the padding (or past the end in ceil mode) are
skipped, never read, so padding never wins; a window wholly inside the padding gives
-inf. Width-3 windows of stride 1 or 2 without dilation have their own loops with constant
offsets (unsigned indices), which vectorize (stride 2: the row maxima's even and odd
columns split into two runs first; reading them at stride 2 in the output loop left it
scalar: 64x111x111 3x3/2, one Zen 4 thread, 405 -> 240 µs, 256x27x27 192 -> 100);
others take the general loop. Planes and rows are read and written through flat unsigned
indices, never views (a view a row cost ~90 ns an output row: one Zen 5 thread, 64x111x111
456 -> 249 µs, 256x27x27 340 -> 182). 3x3 stride-2 pools (ResNet's, SqueezeNet's,
ShuffleNet's) take the rows whose windows lie inside by two long passes over blocks of
input rows (``_plane_3x3s2``): 249 -> 239 and 182 -> 61 µs (onnxruntime 148 and 35; 128x55x55
409 -> 104, onnxruntime 65). NaN propagates
as with ``np.maximum`` (a window holding NaN gives NaN). float32/float64, no Indices
output; None from ``plan_max_pool`` (numba missing, ``$TFRT_PY_JIT=0``, other dtypes) keeps
``pool``'s NumPy fold (one strided ``np.maximum`` per tap). 64x111x111, 3x3 stride 2:
1053 -> ~160 µs on two threads (the polyphase-grid kernel it replaces).

float32 pools of ``lib/pool_ir``'s windows -- 3x3 stride 2, 2x2 stride 2, and 3x3,
5x5, 9x9, 13x13 stride 1 -- whose every output row's window holds a row of the plane
(``pool_ir.window_fits``) take its LLVM IR kernel instead (``_max_pool_ir``: the planes
of a channel range in one call; the same values, NaN as NaN). One Zen 5 thread:
64x111x111 3x3/2 172 -> 90 µs, 256x27x27 64 -> 32; 2x2/2 at 64x224x224 4.8 ms -> 0.59
(onnxruntime 1.65), at 512x28x28 646 -> 54 µs (77); 3x3/1 at 192x28x28 355 -> 61 (66).
Where it is off (no llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable``), for float64 and
for other windows, the loops above run.

Large pools split their channels (one image) or images over tfrt_py's intra-op threads
(from ``NATIVE_SPLIT_MIN_WORK`` on native threads, else from ``SPLIT_MIN_WORK``).
Thread-safe: the plan is immutable; ``tmp`` is per-thread scratch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..common import scratch
from ..lib import pool_ir
from ..lib.jit import Jitted, inline, uses

__all__ = ["MaxPoolPlan", "plan_max_pool", "run_max_pool"]

#: A pool reading at least this many input elements times kernel taps is split over the
#: intra-op threads (64x112x112 3x3: 7M).
SPLIT_MIN_WORK = 1 << 21
#: ... and from this much work when native threads take the parts (~4 µs a split, no
#: GIL): SqueezeNet's last 256x27x27 3x3/2 pool (1.7M) took 134 µs on one thread.
NATIVE_SPLIT_MIN_WORK = 1 << 19


#: The 3x3 stride-2 passes (``_plane_3x3s2``) take blocks of output rows of about this
#: many floats of their two buffers (32 KB: in L1 with what they read). One Zen 5 thread:
#: 64x112x112 over whole planes 321 µs, in blocks 216 (row by row 252).
PLANE_CHUNK_FLOATS = 8192

#: float32 rows' even elements are the low halves of their 64-bit pairs (the plane passes'
#: output loop reads pairs: one truncating move per 8 or 16 outputs, where a stride-2 read
#: stayed scalar)
_LITTLE = sys.byteorder == "little"


def _mx(a: Any, v: Any) -> Any:  # pragma: no cover - numba only
    """max(a, v) with NaN winning, as ``np.maximum`` (no short circuit: vectorizes)."""
    return v if (v > a) | (v != v) else a


@inline
def _rows_max(
    xf: Any, xo: int, h_: int, w_: int, tmp: Any, top: int, kh_: int, dh: int
) -> bool:  # pragma: no cover - numba only
    """``tmp[:w_]`` = the elementwise max of the window's input rows ``top + i * dh`` (i <
    KH) that lie inside the plane at ``xf[xo:]`` (H x W, flat); False, ``tmp`` untouched,
    when none does. Inlined (``jit.inline``)."""
    i = 0
    while i < kh_ and top + i * dh < 0:
        i += 1
    i_end = i
    while i_end < kh_ and top + i_end * dh < h_:
        i_end += 1
    if i == i_end:
        return False
    u = np.uint64
    a0 = u(xo + (top + i * dh) * w_)
    if i_end - i >= 3:
        a1, a2 = a0 + u(dh * w_), a0 + u(2 * dh * w_)
        for t in range(w_):
            k = u(t)
            tmp[k] = _mx(_mx(xf[a0 + k], xf[a1 + k]), xf[a2 + k])
        i += 3
    elif i_end - i == 2:
        a1 = a0 + u(dh * w_)
        for t in range(w_):
            k = u(t)
            tmp[k] = _mx(xf[a0 + k], xf[a1 + k])
        i += 2
    else:
        for t in range(w_):
            k = u(t)
            tmp[k] = xf[a0 + k]
        i += 1
    while i < i_end:  # windows of more than three rows
        a = u(xo + (top + i * dh) * w_)
        for t in range(w_):
            k = u(t)
            tmp[k] = _mx(tmp[k], xf[a + k])
        i += 1
    return True


@inline
def _columns_max(
    of: Any, oo: int, ow_: int, tmp: Any, w_: int, lo: int, hi: int, kw_: int, sw: int,
    dw: int, pl: int,
) -> None:  # fmt: skip  # pragma: no cover - numba only
    """``of[oo + ow]`` = the max of ``tmp`` (a row of ``w_``) over output ``ow``'s window
    columns, those inside the row only (ow < ``ow_``); ``[lo, hi)`` are the windows
    wholly inside. Inlined (``jit.inline``)."""
    # (unsigned offsets: these taps are inside, and numba skips the
    # negative-index wraparound that keeps LLVM from vectorizing)
    u = np.uint64
    one, two = u(1), u(2)
    dst = u(oo + lo)
    if sw == 2 and dw == 1 and kw_ == 3:
        # the window columns b + 2t, +1, +2 de-interleaved first (even and odd columns,
        # a loop LLVM vectorizes with shuffles), then each output from three contiguous
        # runs: the stride-2 reads in the output loop kept it scalar at these row lengths
        n = hi - lo
        base = u(2 * lo - pl)
        ev, od = u(w_), u(w_ + n + 1)
        for t in range(n):
            k = u(t)
            i0 = base + two * k
            tmp[ev + k] = tmp[i0]
            tmp[od + k] = tmp[i0 + one]
        if n > 0:
            tmp[ev + u(n)] = tmp[base + two * u(n)]
        for t in range(n):
            k = u(t)
            of[dst + k] = _mx(_mx(tmp[ev + k], tmp[od + k]), tmp[ev + k + one])
    elif sw == 1 and dw == 1 and kw_ == 3:
        base = u(lo - pl)
        for t in range(hi - lo):
            i0 = base + u(t)
            of[dst + u(t)] = _mx(_mx(tmp[i0], tmp[i0 + one]), tmp[i0 + two])
    else:
        for ow in range(lo, hi):
            first_tap = ow * sw - pl
            a = tmp[first_tap]
            for j in range(1, kw_):
                a = _mx(a, tmp[first_tap + j * dw])
            of[oo + ow] = a
    for e in range(lo + ow_ - hi):  # windows reaching into the padding
        ow = e if e < lo else hi + e - lo
        a = -np.inf  # stays so for a window inside the padding
        first = True
        for j in range(kw_):
            iw = ow * sw - pl + j * dw
            if 0 <= iw < w_:
                a = tmp[iw] if first else _mx(a, tmp[iw])
                first = False
        of[oo + ow] = a


@inline
def _plane_3x3s2(
    xf: Any, xo: int, w_: int, of: Any, oo: int, ow_: int, tmp: Any, r0: int, r1: int,
    pt: int, pl: int, lo: int, hi: int,
) -> None:  # fmt: skip  # pragma: no cover - numba only
    """Output rows ``[r0, r1)`` of a 3x3 stride-2 pool whose windows lie inside the plane
    (``xf[xo:]``, rows ``w_`` wide) vertically, in two long contiguous passes over every
    input row from the first window's to the last's: ``tmp[:n]`` the max of each element
    and the two below it, ``tmp[n:2n]`` the max of that and its two right neighbours;
    each output is then read at its window's corner (float32: the second pass starts at
    an index that puts every corner at an even one, read as the low half of a 64-bit
    pair: 64x111x111 in ceil mode 188 -> 162 µs, 128x55x55 99 -> 85, one Zen 5 thread),
    and the columns ``[lo, hi)`` leave out (windows reaching into the padding) come from
    the first pass. Row by row the
    loops were 13-27 elements long, scalar under 512-bit vectors."""
    u = np.uint64
    n = (2 * (r1 - 1 - r0) + 1) * w_
    a = u(xo + (2 * r0 - pt) * w_)
    w1, w2, one, two = u(w_), u(2 * w_), u(1), u(2)
    for j in range(n):
        k = a + u(j)
        tmp[u(j)] = _mx(_mx(xf[k], xf[k + w1]), xf[k + w2])
    h = u(n + ((n - pl) & 1))  # every output's corner at an even index of tmp
    for j in range(n - 2):
        k = u(j)
        tmp[h + k] = _mx(_mx(tmp[k], tmp[k + one]), tmp[k + two])
    pairs, ofu = tmp.view(np.uint64), of.view(np.uint32)
    for oh in range(r0, r1):
        row = 2 * (oh - r0) * w_
        dst = oo + oh * ow_
        src = h + u(row - pl)
        if tmp.itemsize == 4 and _LITTLE:  # the pairs' low halves: the even elements
            sp, dp = src // two + u(lo), u(dst + lo)
            for t in range(hi - lo):
                ofu[dp + u(t)] = np.uint32(pairs[sp + u(t)] & np.uint64(0xFFFFFFFF))
        else:
            for ow in range(lo, hi):
                of[u(dst + ow)] = tmp[src + two * u(ow)]
        for e in range(lo + ow_ - hi):  # windows reaching into the padding
            ow = e if e < lo else hi + e - lo
            acc = -np.inf
            first = True
            for j in range(3):
                iw = 2 * ow - pl + j
                if 0 <= iw < w_:
                    acc = tmp[row + iw] if first else _mx(acc, tmp[row + iw])
                    first = False
            of[dst + ow] = acc


@uses(_mx, _rows_max, _columns_max, _plane_3x3s2)
def _max_pool2d(
    x: Any, out: Any, geo: Any, tmp: Any, n0: int, n1: int, c0: int, c1: int
) -> None:  # pragma: no cover - numba only
    """out[n, c] = max over the window for images ``[n0, n1)`` and channels ``[c0, c1)``.
    ``geo`` = [KH, KW, sh, sw, dh, dw, pt, pl, chunk, window]; ``tmp`` holds one output row's row
    maxima (W elements), then (stride 2, width 3) their even and odd columns (W + 2 more);
    3x3 stride 2 takes its inside rows ``chunk`` at a time by the plane passes where
    ``tmp`` has room for their two buffers (``plan_max_pool`` sets both; chunk 0: none).
    ``x`` and ``out`` C-contiguous (flat indices: module doc)."""
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    oh_, ow_ = out.shape[2], out.shape[3]
    kh_, kw_, sh, sw, dh, dw, pt, pl, chunk = (
        geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8],
    )  # fmt: skip
    xf, of = x.reshape(-1), out.reshape(-1)
    # output columns whose every tap lies inside the row: lo <= ow < hi
    lo = 0 if pl <= 0 else (pl + sw - 1) // sw
    last = w_ - 1 - (kw_ - 1) * dw + pl  # the last window start (times sw) fully inside
    hi = 0 if last < 0 else min(ow_, last // sw + 1)
    lo = min(lo, hi)
    # 3x3 stride 2 (ResNet's, SqueezeNet's, ShuffleNet's pools): the output rows whose
    # windows lie inside vertically in whole-plane passes (``_plane_3x3s2``)
    r0, r1 = 0, 0
    if chunk > 0 and kh_ == 3 and kw_ == 3 and sh == 2 and sw == 2 and dh == 1 and dw == 1:
        r0 = min(oh_, (pt + 1) // 2)
        r1 = max(r0, min(oh_, (h_ - 3 + pt) // 2 + 1))
        most = min(chunk, r1 - r0)  # output rows a block: 2 buffers of 2 * most - 1 rows
        if r1 - r0 < 2 or tmp.shape[0] < 2 * (2 * most - 1) * w_:
            r0, r1 = 0, 0
    for n in range(n0, n1):
        for c in range(c0, c1):
            xo = (n * c_ + c) * h_ * w_
            oo = (n * c_ + c) * oh_ * ow_
            for q in range(r0, r1, max(chunk, 1)):  # a chunk's two passes stay in L1
                _plane_3x3s2(xf, xo, w_, of, oo, ow_, tmp, q, min(r1, q + chunk), pt, pl, lo,
                             hi)  # fmt: skip
            for oh in range(oh_):
                if r0 <= oh < r1:
                    continue
                # 1. tmp = the max over the window's rows inside the image (>= 1 of them),
                # 2. the output row: the max over each window's columns of tmp
                at = oo + oh * ow_
                if _rows_max(xf, xo, h_, w_, tmp, oh * sh - pt, kh_, dh):
                    _columns_max(of, at, ow_, tmp, w_, lo, hi, kw_, sw, dw, pl)
                else:  # a window inside the padding (pads >= the kernel)
                    for t in range(ow_):
                        of[at + t] = -np.inf


def _warm(fn: Any) -> None:
    t = np.float32
    x, y = np.zeros((1, 1, 3, 3), t), np.zeros((1, 1, 2, 2), t)
    geo = np.array([2, 2, 1, 1, 1, 1, 0, 0, 0, -1], np.int64)
    fn(x, y, geo, np.zeros(3, t), 0, 1, 0, 1)


_MAX_POOL = Jitted(_max_pool2d, _warm)

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles.
numba: Any = None


def _max_pool2d_par(x: Any, out: Any, geo: Any, tmp: Any, blocks: Any) -> None:  # pragma: no cover
    """``_max_pool2d`` over ``blocks`` (rows n0, n1, c0, c1) in a ``prange`` loop on native
    threads (``concurrency.native_threads``), each with its own row of ``tmp``."""
    for i in numba.prange(blocks.shape[0]):
        _max_pool2d(x, out, geo, tmp[i], blocks[i, 0], blocks[i, 1], blocks[i, 2], blocks[i, 3])


def _warm_par(fn: Any) -> None:
    t = np.float32
    x, y = np.zeros((1, 2, 3, 3), t), np.zeros((1, 2, 2, 2), t)
    geo = np.array([2, 2, 1, 1, 1, 1, 0, 0, 0, -1], np.int64)
    blocks = native_threads.plane_blocks(1, 2, 2)  # read-only, as the kernel's
    fn(x, y, geo, np.zeros((2, 3), t), blocks)


_MAX_POOL_PAR = Jitted(_max_pool2d_par, _warm_par, helpers=(_max_pool2d,), parallel=True)


#: pool_ir's ExternalFunction, set by ``_prepare_ir`` before the two below compile
maxpool_windows: Any = None


def _max_pool_ir(
    x: Any, out: Any, geo: Any, tmp: Any, n0: int, n1: int, c0: int, c1: int
) -> None:  # pragma: no cover - numba only
    """``_max_pool2d`` for a float32 pool of one of ``pool_ir.WINDOWS`` (``geo[9]`` its
    index) by ``pool_ir``'s kernel, the planes of channels ``[c0, c1)`` of each image at
    once (``tmp`` unused). ``pool_avg._avg_pool`` is its AveragePool twin: numba binds
    each to its own ExternalFunction global, so the two loops stay apart."""
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    oh_, ow_ = out.shape[2], out.shape[3]
    for n in range(n0, n1):
        xo = ((n * c_ + c0) * h_ * w_) * 4
        oo = ((n * c_ + c0) * oh_ * ow_) * 4
        maxpool_windows(x.ctypes.data + xo, out.ctypes.data + oo, c1 - c0, h_, w_, oh_, ow_,
                        geo[6], geo[7], geo[9])  # fmt: skip


def _max_pool_ir_par(x: Any, out: Any, geo: Any, tmp: Any, blocks: Any) -> None:  # pragma: no cover
    """``_max_pool_ir`` over ``blocks`` (rows n0, n1, c0, c1) in a ``prange`` loop."""
    for i in numba.prange(blocks.shape[0]):
        _max_pool_ir(x, out, geo, tmp, blocks[i, 0], blocks[i, 1], blocks[i, 2], blocks[i, 3])


def _prepare_ir(module_globals: dict[str, Any]) -> bool:
    module_globals["maxpool_windows"] = fn = pool_ir.kernel()
    return fn is not None


def _warm_ir(fn: Any) -> None:
    t = np.float32
    geo = np.array([3, 3, 2, 2, 1, 1, 0, 0, 0, 0], np.int64)
    fn(np.zeros((1, 1, 3, 3), t), np.zeros((1, 1, 1, 1), t), geo, np.zeros(1, t), 0, 1, 0, 1)


def _warm_ir_par(fn: Any) -> None:
    t = np.float32
    geo = np.array([3, 3, 2, 2, 1, 1, 0, 0, 0, 0], np.int64)
    blocks = native_threads.plane_blocks(1, 2, 2)
    fn(np.zeros((1, 2, 3, 3), t), np.zeros((1, 2, 1, 1), t), geo, np.zeros((2, 1), t), blocks)


_MAX_POOL_IR = Jitted(_max_pool_ir, _warm_ir, prepare=_prepare_ir)
_MAX_POOL_IR_PAR = Jitted(
    _max_pool_ir_par, _warm_ir_par, helpers=(_max_pool_ir,), parallel=True, prepare=_prepare_ir
)


def _ir_window(
    x_shape: tuple[int, ...], kernel: tuple[int, ...], out_shape: tuple[int, ...],
    strides: tuple[int, ...], pads_begin: tuple[int, ...], dilations: tuple[int, ...],
    dtype: np.dtype,
) -> int:  # fmt: skip
    """The index of the pool's window in ``pool_ir.WINDOWS`` where its kernel takes the
    pool (float32, no dilation, ``pool_ir.window_fits``), else -1."""
    if dtype != np.float32 or tuple(dilations) != (1, 1) or pool_ir.lanes() == 0:
        return -1
    k = pool_ir.window_index(kernel, strides, pool_ir.lanes())
    if k < 0 or not pool_ir.window_fits(x_shape, out_shape, kernel, strides, pads_begin):
        return -1
    return k


class MaxPoolPlan(NamedTuple):
    """What ``run_max_pool`` needs for one input shape, made once."""

    fn: Any
    geo: np.ndarray
    tmp_len: int
    out_shape: tuple[int, ...]
    split: bool
    #: the Jitted parallel form of ``fn`` (``get()`` None: the Python pool's parts)
    par: Jitted


def plan_max_pool(
    x_shape: tuple[int, ...],
    kernel: tuple[int, ...],
    out_shape: tuple[int, ...],
    strides: tuple[int, ...],
    pads_begin: tuple[int, ...],
    dilations: tuple[int, ...],
    dtype: np.dtype,
) -> MaxPoolPlan | None:
    """The plan of a 2-D MaxPool for one input shape, or None (see the module doc)."""
    if len(x_shape) != 4 or dtype not in (np.float32, np.float64):
        return None
    window = _ir_window(x_shape, kernel, out_shape, strides, pads_begin, dilations, dtype)
    fn = _MAX_POOL_IR.get() if window >= 0 else None
    ir = fn is not None
    fn = fn if ir else _MAX_POOL.get()
    if fn is None:
        return None
    # a row's maxima, then (stride 2, width 3) its even and odd columns; 3x3 stride 2 the
    # two buffers of the plane passes (``_plane_3x3s2``) for ``chunk`` output rows a block
    w = x_shape[3]
    tmp_len, chunk = 2 * w + 2, 0
    if tuple(kernel) == (3, 3) and tuple(strides) == (2, 2) and tuple(dilations) == (1, 1):
        chunk = max(2, PLANE_CHUNK_FLOATS // (4 * w))  # 2 buffers of 2 * chunk - 1 rows
        tmp_len = max(tmp_len, 2 * (2 * chunk - 1) * w)
    if ir:  # pool_ir's kernel holds its rows in registers
        tmp_len = 1
    geo = np.array(
        [kernel[0], kernel[1], strides[0], strides[1], dilations[0], dilations[1],
         pads_begin[0], pads_begin[1], chunk, window],
        np.int64,
    )  # fmt: skip
    work = int(np.prod(x_shape)) * kernel[0] * kernel[1]
    par = _MAX_POOL_IR_PAR if ir else _MAX_POOL_PAR
    enough = work >= SPLIT_MIN_WORK or (work >= NATIVE_SPLIT_MIN_WORK and par.get() is not None)
    split = intra_pool().threads > 1 and enough and max(x_shape[:2]) > 1
    return MaxPoolPlan(fn, geo, tmp_len, tuple(out_shape), split, par)


def run_max_pool(plan: MaxPoolPlan, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The pooled ``x`` (C-contiguous, the plan's dtype) into ``out`` (C-contiguous) or a
    new array; the caller takes part in a split."""
    dt = x.dtype
    y = np.empty(plan.out_shape, dt) if out is None else out
    fn, geo, tmp_len = plan.fn, plan.geo, (plan.tmp_len,)
    n, c = x.shape[0], x.shape[1]
    if not plan.split:
        fn(x, y, geo, scratch(0, tmp_len, dt), 0, n, 0, c)
        return y
    pool = intra_pool()
    by_channel = n == 1
    total = c if by_channel else n
    par = plan.par.get()
    if par is not None:  # blocks of channels (one image) or images on native threads
        rows = native_threads.plane_blocks(n, c, 2 * native_threads.enter(pool.threads))
        par(x, y, geo, scratch(0, (len(rows), plan.tmp_len), dt), rows)
        return y
    blocks = min(2 * pool.threads, total)
    edges = [total * i // blocks for i in range(blocks + 1)]

    def part(a: int, b: int) -> Callable[[], None]:
        n0, n1, c0, c1 = (0, 1, a, b) if by_channel else (a, b, 0, c)
        return lambda: fn(x, y, geo, scratch(0, tmp_len, dt), n0, n1, c0, c1)

    pool.run([part(edges[i], edges[i + 1]) for i in range(blocks)])
    return y
