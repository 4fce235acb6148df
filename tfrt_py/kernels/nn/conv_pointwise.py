"""A 1x1 stride-1 unpadded convolution (a pointwise conv: ``y[i] = W @ x[i]`` per image,
then bias, residual and activation) -- or any one-group conv, ``x[i]`` then being its
im2col columns -- in blocks of filters on native threads, each block's epilogue run by
the thread that computed it while its rows are in cache.

Before, the product ran in filter blocks on native threads (``gemm.native_blocks``) and
the epilogue afterwards over the whole output on the caller alone: a MobileNet/
EfficientNet expand conv (16 -> 96 filters over 112x112) spent 350 µs in the product and
710 more in one thread's SiLU over 1.2M elements, a pass that also read the output back
from memory. Here each (image, filters ``[m0, m1)``) block is one gemm of NumPy's BLAS on
its rows (leading dimensions, no copies) followed by the bias, the residual and
``conv_direct``'s activation over the same rows (row by row in one pass each, or over the
block as one contiguous run when the rows are short).

Results equal the whole-image product's to rounding (the same K per dot product) and the
epilogue's exactly. numba only (``POINTWISE_PAR.get()`` is None without it); the plan
(``conv_blocked.plan_blocked``) decides when it applies. Thread-safe: no state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib import blas
from ..lib.activations import PARAMS_LEN
from ..lib.jit import CONTRACT, Jitted, frozen
from .conv_direct import SHORT_RUN, _act_row, _epilogue_row, _epilogue_run

__all__ = ["POINTWISE_PAR", "filter_blocks"]

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles, and
#: NumPy's BLAS gemm (``blas.register``, its ``prepare``).
numba: Any = None
_sgemm: Any = None
_dgemm: Any = None

#: Filter blocks are multiples of this many rows (BLAS's float32 micro-kernels are 8 or
#: 16 rows tall: a ragged block wastes a partial panel) where the filters allow it.
_ROW_QUANTUM = 16


def _pointwise_par(  # pragma: no cover - numba only
    x3: Any, w2: Any, y3: Any, b: Any, res3: Any, blocks: Any, act: int, p: Any
) -> None:
    """y3[i, m0:m1] = act(w2[m0:m1] @ x3[i] + b[m0:m1] + res3[i, m0:m1]) for the
    ``blocks`` rows (i, m0, m1), in a ``prange`` loop on native threads. ``x3`` (N, K, O),
    ``w2`` (M, K), ``y3`` and ``res3`` (N, M, O) C-contiguous, one dtype; ``b`` empty: no
    bias; ``res3`` empty: no residual; ``act``/``p``: ``conv_direct``'s activation code and
    parameters."""
    m, k = w2.shape
    o = y3.shape[2]
    has_b = b.shape[0] > 0
    has_res = res3.shape[0] > 0
    zero, one = p[2], p[3]
    sz = y3.itemsize
    for q in numba.prange(blocks.shape[0]):
        i, m0, m1 = blocks[q, 0], blocks[q, 1], blocks[q, 2]
        # addresses in uint64 (uint64 + int64 would be a float64 in numba's typing)
        pa = w2.ctypes.data + np.uint64(m0 * k * sz)
        pb = x3.ctypes.data + np.uint64(i * k * o * sz)
        pc = y3.ctypes.data + np.uint64((i * m + m0) * o * sz)
        if sz == 4:
            _sgemm(101, 111, 111, m1 - m0, o, k, one, pa, k, pb, o, zero, pc, o)
        else:
            _dgemm(101, 111, 111, m1 - m0, o, k, one, pa, k, pb, o, zero, pc, o)
        if o >= SHORT_RUN:  # each row in one pass: bias, residual, activation
            for mm in range(m0, m1):
                row = y3[i, mm]
                r = res3[i, mm] if has_res else row
                _epilogue_row(row, b[mm] if has_b else zero, r, has_b, has_res, act, p)
            continue
        # short rows (conv_direct.SHORT_RUN) as one contiguous run
        blk = y3[i].reshape(m * o)[m0 * o : m1 * o]
        rblk = res3[i].reshape(m * o)[m0 * o : m1 * o] if has_res else blk
        _epilogue_run(blk, b, rblk, m0, o, has_b, has_res, act, p)


def _warm_pointwise_par(fn: Any) -> None:
    t = np.float32
    x3, w2, y3 = np.ones((1, 3, 4), t), frozen(np.ones((2, 3), t)), np.zeros((1, 2, 4), t)
    blocks = np.array([[0, 0, 1], [0, 1, 2]], np.int64)
    b, e3 = frozen(np.zeros(2, t)), np.zeros((0, 0, 0), t)
    fn(x3, w2, y3, b, e3, blocks, 0, np.zeros(PARAMS_LEN, t))


def _prepare(module_globals: dict[str, Any]) -> bool:
    return blas.register(module_globals)


POINTWISE_PAR = Jitted(
    _pointwise_par,
    _warm_pointwise_par,
    helpers=(_act_row, _epilogue_row, _epilogue_run),
    fastmath=CONTRACT,
    parallel=True,
    prepare=_prepare,
)


def filter_blocks(n: int, m: int, parts: int) -> np.ndarray:
    """(image, m0, m1) rows, int64: each image's ``m`` filters in ``parts`` blocks (fewer
    when ``m`` is small), block edges on multiples of ``_ROW_QUANTUM`` where ``m`` allows."""
    q = _ROW_QUANTUM if m >= _ROW_QUANTUM * parts else 1
    units = -(-m // q)
    parts = max(1, min(parts, units))
    edges = [min(m, q * (units * j // parts)) for j in range(parts + 1)]
    return np.array(
        [(i, edges[j], edges[j + 1]) for i in range(n) for j in range(parts)
         if edges[j + 1] > edges[j]],
        np.int64,
    ).reshape(-1, 3)  # fmt: skip
