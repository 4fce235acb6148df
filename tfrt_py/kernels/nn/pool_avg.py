"""A compiled float32 2-D AveragePool for ``lib/pool_ir``'s windows (helper of ``pool``):
2x2 stride 2 (DenseNet's transitions), 3x3 stride 1 (Inception's branches) and the rest of
``pool_ir.WINDOWS``.

Each output is the sum of its window's taps inside the plane (rows first, then columns;
padding adds nothing) times the output's 1 / divisor from ``pool``'s plan (``scale``:
count_include_pad and ceil mode decided there, made an (OH, OW) float32 plane here, the
same for every plane). ``pool``'s NumPy fold sums the taps in another order: the two agree
to float32 rounding. One Zen 5 thread, against onnxruntime in one process: 2x2/2 at
128x56x56 194 -> 34-40 µs (onnxruntime 63-80), 3x3/1 padded at 192x35x35 562 -> 83 (77).

``plan_avg_pool`` returns None (``pool`` keeps its fold) where the kernel is off (no
llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable``), without numba, for other dtypes,
windows, dilations and ranks. Large pools split their channels (one image) or images over
the native threads. Thread-safe: the plan is immutable.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..lib import pool_ir
from ..lib.jit import Jitted
from .pool_direct import NATIVE_SPLIT_MIN_WORK

__all__ = ["AvgPoolPlan", "plan_avg_pool", "run_avg_pool"]

#: pool_ir's average ExternalFunction, set by ``_prepare`` before the two below compile
avgpool_windows: Any = None
#: numba, set by ``Jitted(parallel=True)`` before the parallel loop compiles.
numba: Any = None


def _avg_pool(
    x: Any, out: Any, geo: Any, scale: Any, n0: int, n1: int, c0: int, c1: int
) -> None:  # pragma: no cover - numba only
    """Images ``[n0, n1)``, channels ``[c0, c1)``: ``geo`` = [pt, pl, window]."""
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    oh_, ow_ = out.shape[2], out.shape[3]
    for n in range(n0, n1):
        xo = ((n * c_ + c0) * h_ * w_) * 4
        oo = ((n * c_ + c0) * oh_ * ow_) * 4
        avgpool_windows(x.ctypes.data + xo, out.ctypes.data + oo, c1 - c0, h_, w_, oh_, ow_,
                        geo[0], geo[1], scale.ctypes.data, geo[2])  # fmt: skip


def _avg_pool_par(x: Any, out: Any, geo: Any, scale: Any, blocks: Any) -> None:  # pragma: no cover
    """``_avg_pool`` over ``blocks`` (rows n0, n1, c0, c1) in a ``prange`` loop."""
    for i in numba.prange(blocks.shape[0]):
        _avg_pool(x, out, geo, scale, blocks[i, 0], blocks[i, 1], blocks[i, 2], blocks[i, 3])


def _prepare(module_globals: dict[str, Any]) -> bool:
    module_globals["avgpool_windows"] = fn = pool_ir.kernel(avg=True)
    return fn is not None


def _warm(fn: Any) -> None:
    t = np.float32
    geo, scale = np.array([0, 0, 0], np.int64), np.ones((1, 1), t)
    fn(np.zeros((1, 1, 3, 3), t), np.zeros((1, 1, 1, 1), t), geo, scale, 0, 1, 0, 1)


def _warm_par(fn: Any) -> None:
    t = np.float32
    geo, scale = np.array([0, 0, 0], np.int64), np.ones((1, 1), t)
    blocks = native_threads.plane_blocks(1, 2, 2)
    fn(np.zeros((1, 2, 3, 3), t), np.zeros((1, 2, 1, 1), t), geo, scale, blocks)


_AVG_POOL = Jitted(_avg_pool, _warm, prepare=_prepare)
_AVG_POOL_PAR = Jitted(_avg_pool_par, _warm_par, helpers=(_avg_pool,), parallel=True,
                       prepare=_prepare)  # fmt: skip


class AvgPoolPlan(NamedTuple):
    """What ``run_avg_pool`` needs for one input shape, made once."""

    fn: Any
    geo: np.ndarray
    scale: np.ndarray  # (OH, OW) float32, read-only
    out_shape: tuple[int, ...]
    split: bool


def plan_avg_pool(
    x_shape: tuple[int, ...], kernel: tuple[int, ...], out_shape: tuple[int, ...],
    strides: tuple[int, ...], pads_begin: tuple[int, ...], dilations: tuple[int, ...],
    dtype: np.dtype, scale: Any,
) -> AvgPoolPlan | None:  # fmt: skip
    """The plan of a 2-D AveragePool for one input shape, or None (module doc); ``scale``:
    ``pool``'s 1 / divisor, a scalar or an (OH, OW) array."""
    if len(x_shape) != 4 or dtype != np.float32 or tuple(dilations) != (1, 1):
        return None
    n = pool_ir.lanes()
    k = pool_ir.window_index(kernel, strides, n) if n else -1
    if k < 0 or min(pads_begin) < 0 or max(x_shape[2:]) >= 1 << 30:
        return None
    fn = _AVG_POOL.get()
    if fn is None:
        return None
    plane = np.ascontiguousarray(np.broadcast_to(np.asarray(scale, np.float32), out_shape[2:]))
    plane.flags.writeable = False
    geo = np.array([pads_begin[0], pads_begin[1], k], np.int64)
    work = int(np.prod(x_shape)) * kernel[0] * kernel[1]
    split = (intra_pool().threads > 1 and work >= NATIVE_SPLIT_MIN_WORK
             and max(x_shape[:2]) > 1)  # fmt: skip
    return AvgPoolPlan(fn, geo, plane, tuple(out_shape), split)


def run_avg_pool(plan: AvgPoolPlan, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The pooled ``x`` (C-contiguous float32) into ``out`` (C-contiguous) or a new array;
    a split runs on the native threads where they are up, else on the caller."""
    y = np.empty(plan.out_shape, np.float32) if out is None else out
    n, c = x.shape[0], x.shape[1]
    par = _AVG_POOL_PAR.get() if plan.split else None
    if par is not None:
        threads = native_threads.enter(intra_pool().threads)
        par(x, y, plan.geo, plan.scale, native_threads.plane_blocks(n, c, 2 * threads))
    else:
        plan.fn(x, y, plan.geo, plan.scale, 0, n, 0, c)
    return y
