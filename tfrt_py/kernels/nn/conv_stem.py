"""A float32 stem conv (at most ``stem_ir.MAX_CHANNELS`` input channels, a 3x3 window at
stride 2, one group, constant weights, no residual) on ``lib/stem_ir``'s kernel: the node
function ``conv`` tries before the blocked routes (``stem_conv_fn``), and the numba side
that runs the kernel over blocks of output rows, serially or in a ``prange`` loop on
native threads.

The kernel applies the bias and ReLU, Clip or HardSwish; any other activation runs here over each
filter's rows of the block right after it (``activations._act_row``, while they are in
cache). Against the route it replaces (im2col into 27 rows as long as the output, then
the packed product with K = 27) on one Intel AVX-512 thread, a 224x224x3 image into 32
filters: 190 µs against 270-360 (``stem_ir``).

``stem_conv_fn(node)`` is ``fn(x, b, r, out)`` -> the output or None (another shape, a
residual, another dtype: the caller's routes), or None where the conv or this process
cannot take it. Thread-safe: plans are memoized per shape and immutable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..common import ShapeMemo
from ..lib import stem_ir
from ..lib.activations import ACTIVATIONS, PARAMS_LEN, _act_row, _params
from ..lib.jit import Jitted, frozen
from .conv_common import ConvNode, bias_vector, conv_geometry

__all__ = ["StemPlan", "stem_conv_fn"]

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop compiles, and the
#: kernel's ExternalFunction (``_prepare``).
numba: Any = None
stem_kernel: Any = None

#: Output rows a block holds at least: fewer leave a thread's part to the loop's overheads.
MIN_BLOCK_ROWS = 4


def _stem_rows(  # pragma: no cover - numba only
    x: Any, wp: Any, bp: Any, y: Any, lohi: Any, geo: Any, i: int, r0: int, r1: int, act: int,
    p: Any,
) -> None:  # fmt: skip
    """Output rows ``[r0, r1)`` of image ``i`` by the kernel (``geo``: pads top and left),
    then ``act`` (0: none, or the kernel's own clamp) over each
    filter's rows."""
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    m, oh_, ow_ = y.shape[1], y.shape[2], y.shape[3]
    xo = np.uint64(i * c_ * h_ * w_ * 4)
    yo = np.uint64(i * m * oh_ * ow_ * 4)
    stem_kernel(x.ctypes.data + xo, wp.ctypes.data, bp.ctypes.data, y.ctypes.data + yo,
                lohi.ctypes.data, c_, h_, w_, oh_, ow_, geo[0], geo[1], m, r0, r1)  # fmt: skip
    if act != 0:
        yf = y.reshape(-1)
        neg0 = -p[2]
        for f in range(m):
            at = (i * m + f) * oh_ * ow_
            _act_row(yf[at + r0 * ow_ : at + r1 * ow_], neg0, act, p)


def _stem(  # pragma: no cover - numba only
    x: Any, wp: Any, bp: Any, y: Any, lohi: Any, geo: Any, blocks: Any, act: int, p: Any
) -> None:
    """The blocks (rows image, first output row, end row), one after another."""
    for q in range(blocks.shape[0]):
        _stem_rows(x, wp, bp, y, lohi, geo, blocks[q, 0], blocks[q, 1], blocks[q, 2], act, p)


def _stem_par(  # pragma: no cover - numba only
    x: Any, wp: Any, bp: Any, y: Any, lohi: Any, geo: Any, blocks: Any, act: int, p: Any
) -> None:
    """``_stem`` in a ``prange`` loop on native threads."""
    for q in numba.prange(blocks.shape[0]):
        _stem_rows(x, wp, bp, y, lohi, geo, blocks[q, 0], blocks[q, 1], blocks[q, 2], act, p)


def _prepare(module_globals: dict[str, Any]) -> bool:
    module_globals["stem_kernel"] = fn = stem_ir.kernel()
    return fn is not None


def _warm(fn: Any) -> None:
    t = np.float32
    n = stem_ir.host_width()  # _prepare has checked there is a kernel: n is 16 or 8
    w = frozen(stem_ir.pack(np.zeros((1, 1, 3, 3), t), n))
    b = frozen(stem_ir.pack_bias(None, 1, n))
    blocks = frozen(np.array([[0, 0, 1]], np.int64))
    geo = frozen(np.array([1, 1], np.int64))
    fn(np.zeros((1, 1, 3, 3), t), w, b, np.zeros((1, 1, 2, 2), t), frozen(np.zeros(3, t)), geo,
       blocks, 0, np.zeros(PARAMS_LEN, t))  # fmt: skip


_HELPERS = (_stem_rows, _act_row)
_STEM = Jitted(_stem, _warm, helpers=_HELPERS, prepare=_prepare)
_STEM_PAR = Jitted(_stem_par, _warm, helpers=_HELPERS, parallel=True, prepare=_prepare)


class StemPlan(NamedTuple):
    """One input shape's run (immutable)."""

    out_shape: tuple[int, ...]
    blocks: np.ndarray  # (image, first output row, end row), int64, read-only
    geo: np.ndarray  # (pad top, pad left), int64, read-only
    parallel: bool  # blocks on native threads


def _blocks(n: int, oh: int, parts: int) -> np.ndarray:
    """(image, r0, r1) rows: each image's output rows in about ``parts / n`` blocks of at
    least ``MIN_BLOCK_ROWS``."""
    per = max(1, min(-(-parts // n), oh // MIN_BLOCK_ROWS))
    rows = [(i, oh * k // per, oh * (k + 1) // per) for i in range(n) for k in range(per)]
    return frozen(np.array(rows, np.int64))


def stem_conv_fn(node: ConvNode) -> Callable[..., np.ndarray | None] | None:
    """``fn(x, b, r, out)`` for a conv the kernel takes (module docstring), else None."""
    sp, group, w_const, b_c, cdt, epi = node
    if w_const is None or w_const.ndim != 4 or cdt != np.float32 or group != 1:
        return None
    if epi.residual or w_const.shape[1] > stem_ir.MAX_CHANNELS:
        return None
    kernel, strides, dil, pads = sp.resolve(w_const.shape[2:])
    if not stem_ir.takes(kernel, strides, dil, pads[:2]) or stem_ir.kernel() is None:
        return None
    if _STEM.get() is None:
        return None
    if intra_pool().threads > 1 and native_threads.ready():
        _STEM_PAR.get()  # compiled at load, not in a first call at some shape
    n = stem_ir.host_width()
    m = w_const.shape[0]
    wp = frozen(stem_ir.pack(w_const, n))
    bp_const = frozen(stem_ir.pack_bias(b_c, m, n))
    act = ACTIVATIONS[epi.act]
    p = _params(epi, np.dtype(np.float32))
    inf = np.inf
    clamp = {0: (-inf, inf, 0.0), ACTIVATIONS["Relu"]: (0.0, inf, 0.0),
             ACTIVATIONS["Clip"]: (float(p[0]), float(p[1]), 0.0),
             ACTIVATIONS["HardSwish"]: (-inf, inf, 1.0)}.get(act)  # fmt: skip
    lohi = frozen(np.array(clamp or (-inf, inf, 0.0), np.float32))
    after = 0 if clamp is not None else act  # what _act_row applies after the kernel
    plans: ShapeMemo[tuple[int, ...], StemPlan | None] = ShapeMemo()
    w_shape = w_const.shape

    def plan_for(shape: tuple[int, ...]) -> StemPlan | None:
        if len(shape) != 4 or shape[1] != w_shape[1]:
            return None
        begin, _, out_sp = conv_geometry(shape[2:], kernel, strides, dil, pads, sp.auto_pad)
        if (
            min(out_sp) < 1
            or max(shape[2:]) >= 1 << 30
            or not stem_ir.takes(kernel, strides, dil, begin)
        ):
            return None
        threads = intra_pool().threads
        parallel = threads > 1 and native_threads.ready() and _STEM_PAR.get() is not None
        blocks = _blocks(shape[0], out_sp[0], 2 * threads if parallel else 1)
        geo = frozen(np.array([begin[0], begin[1]], np.int64))
        return StemPlan((shape[0], m, *out_sp), blocks, geo, parallel and len(blocks) > 1)

    def stem(x: np.ndarray, b: Any, r: Any, out: Any) -> np.ndarray | None:
        if r is not None or x.dtype != np.float32:
            return None
        if x.shape in plans:
            plan = plans[x.shape]
        else:
            plan = plans.put(x.shape, plan_for(x.shape))
        if plan is None:
            return None
        bb = bias_vector(b, b_c, cdt)
        bp = bp_const if bb is b_c else stem_ir.pack_bias(bb, m, n)
        fn = _STEM_PAR.get() if plan.parallel else _STEM.get()
        if fn is None:  # compiled kernels may not run on this thread now (``Jitted.get``)
            return None
        if plan.parallel:
            native_threads.enter(intra_pool().threads)
        y = out if out is not None and out.flags.c_contiguous else np.empty(plan.out_shape, cdt)
        xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        fn(xc, wp, bp, y, lohi, plan.geo, plan.blocks, after, p)
        if out is not None and y is not out:
            out[...] = y
            return out
        return y

    return stem
