"""Softmax attention, ``softmax(alpha * q @ swapaxes(k, -1, -2)) @ v`` over the last axis,
in blocks of query rows: per block, the scores into a scratch of a few dozen KB, the
softmax over them while they are in cache, the product by ``v`` straight into the output.

Unfused, the three ops write the whole score tensor and read it back twice: MobileViT's
4x4x256x256 scores (4 MB) cost 364 µs in the product, 532 in the Softmax and 295 in the
product by ``v``, mostly memory traffic. Here a block is one call of NumPy's BLAS gemm
(the scores: ``alpha`` is its factor, ``k`` read transposed in place), ``softmax_jit``'s
compiled rows (the Softmax kernel's own loop: the same values, NaN rows included) and one
more gemm, and the blocks run in a ``prange`` loop on native threads. Operands may be
strided views (a head split of one projection) whose batch dimensions collapse into two
strides (``gemm.batch_layout``).

``softmax_attention(q, k, v, alpha, out)`` takes that path for float32 stacks of one batch
shape with numba's TBB layer (``concurrency.native_threads``) and NumPy's BLAS; anything
else (float64, broadcast batch dims, no numba) runs the unfused formulation with the same
semantics (``Softmax`` opset 13 along the last axis: a row with a NaN, an all ``-inf``
row or one whose max is ``+inf`` gives NaN). Thread-safe: no state but the compiled
function; each block allocates its own scratch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from . import blas
from .addresses import addresses
from .gemm import batch_layout, matmul_batched_into
from .jit import CONTRACT, Jitted
from .sigmoid_jit import EXP_CONSTS
from .softmax_jit import _softmax_long_rows, softmax_rows_f32

__all__ = ["BLOCK_BYTES", "FUSED_MIN_MACS", "softmax_attention"]

#: Attention of fewer multiply-adds than this runs unfused: the blocks' set-up (a scratch
#: and two gemm calls each) costs more than the passes it saves ((2, 5, 9) by 7: 27 µs
#: fused, 14 unfused).
FUSED_MIN_MACS = 1 << 16
#: A block's scores take at most about this many bytes (rows of the key length): in L2
#: with the block's rows of ``v``.
BLOCK_BYTES = 1 << 16

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles, and
#: NumPy's BLAS gemm (``blas.register``, its ``prepare``).
numba: Any = None
_sgemm: Any = None
_dgemm: Any = None


def _sdpa_blocks(
    ptr: Any, dims: Any, blocks: Any, c: Any, alpha: float
) -> None:  # pragma: no cover - numba only
    """For the ``blocks`` rows (matrix i, first query row, end row) in a ``prange`` loop:
    S = alpha * q[i, r0:r1] @ k[i].T (gemm into the block's own scratch), the softmax of
    each row of S (``_softmax_long_rows``), out[i, r0:r1] = S @ v[i] (gemm). ``ptr``: the
    addresses of q, k, v and out; ``dims`` = [Lq, Lk, d, dv, matrices per outer batch
    step, then per operand (q, k, v, out) its inner batch, row and outer batch strides]
    in elements; float32."""
    lk, d, dv, inner = dims[1], dims[2], dims[3], dims[4]
    sq, lq_, oq = dims[5], dims[6], dims[7]
    sk, lk_, ok = dims[8], dims[9], dims[10]
    sv, lv_, ov = dims[11], dims[12], dims[13]
    so, lo_, oo = dims[14], dims[15], dims[16]
    for t in numba.prange(blocks.shape[0]):
        i, r0, r1 = blocks[t, 0], blocks[t, 1], blocks[t, 2]
        rows = r1 - r0
        o, r = i // inner, i % inner
        s = np.empty((rows, lk), np.float32)
        pq = ptr[0] + np.uint64((o * oq + r * sq + r0 * lq_) * 4)
        pk = ptr[1] + np.uint64((o * ok + r * sk) * 4)
        pv = ptr[2] + np.uint64((o * ov + r * sv) * 4)
        po = ptr[3] + np.uint64((o * oo + r * so + r0 * lo_) * 4)
        _sgemm(101, 111, 112, rows, lk, d, np.float32(alpha), pq, lq_, pk, lk_,
               np.float32(0), s.ctypes.data, lk)  # fmt: skip
        _softmax_long_rows(s, s, c, 0, rows)
        _sgemm(101, 111, 111, rows, dv, lk, np.float32(1), s.ctypes.data, lk, pv, lv_,
               np.float32(0), po, lo_)  # fmt: skip


def _warm(fn: Any) -> None:
    q, k = np.ones((2, 3, 4), np.float32), np.ones((2, 5, 4), np.float32)
    v, out = np.ones((2, 5, 2), np.float32), np.empty((2, 3, 2), np.float32)
    ptr = np.array([a.ctypes.data for a in (q, k, v, out)], np.uint64)
    dims = np.array([3, 5, 4, 2, 2, 12, 4, 0, 20, 4, 0, 10, 2, 0, 6, 2, 0], np.int64)
    blocks = np.array([[0, 0, 2], [0, 2, 3], [1, 0, 3]], np.int64)
    fn(ptr, dims, blocks, EXP_CONSTS, 1.0)


def _prepare(module_globals: dict[str, Any]) -> bool:
    return blas.register(module_globals)


_SDPA = Jitted(
    _sdpa_blocks,
    _warm,
    helpers=(_softmax_long_rows,),
    fastmath=CONTRACT,
    parallel=True,
    prepare=_prepare,
)

#: Blocks by (matrices, query rows, rows per block) (a dict write is atomic).
_BLOCKS: dict[tuple[int, int, int], np.ndarray] = {}


def softmax_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    alpha: float = 1.0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``softmax(alpha * q @ swapaxes(k, -1, -2), axis=-1) @ v`` into ``out`` when given
    (module doc)."""
    y = _fused(q, k, v, alpha, out)
    if y is not None:
        return y
    s = matmul_batched_into(q, k, None, trans_b=True, alpha=alpha)
    jit = softmax_rows_f32() if s.dtype == np.float32 and s.ndim and s.size else None
    if jit is not None:
        rows = s.reshape(-1, s.shape[-1])
        jit(rows, rows)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(s, s.max(axis=-1, keepdims=True), out=s)
            np.exp(s, out=s)
            np.divide(s, s.sum(axis=-1, keepdims=True), out=s)
    return np.matmul(s, v, out=out)


def _fused(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: float, out: np.ndarray | None
) -> np.ndarray | None:
    """The blocked path, or None when it does not apply (module doc)."""
    if (
        q.ndim < 3
        or not (q.ndim == k.ndim == v.ndim)
        or not (q.dtype == k.dtype == v.dtype == np.float32)
        or not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2])
        or k.shape[-1] != q.shape[-1]
        or v.shape[-2] != k.shape[-2]
        or 0 in q.shape
        or 0 in v.shape
    ):
        return None
    lq, d = q.shape[-2], q.shape[-1]
    lk, dv = k.shape[-2], v.shape[-1]
    work = math.prod(q.shape[:-2]) * lq * lk * (d + dv)
    if work < FUSED_MIN_MACS:
        return None
    shape = (*q.shape[:-1], dv)
    if out is not None and (out.shape != shape or out.dtype != np.float32):
        return None
    fn = _SDPA.get()
    if fn is None:
        return None
    y = np.empty(shape, np.float32) if out is None else out
    lay = batch_layout((q, d), (k, d), (v, dv), (y, dv))
    if lay is None:
        return None
    inner, strides = lay
    batch = math.prod(q.shape[:-2])
    per = max(1, BLOCK_BYTES // (4 * lk))  # query rows per block
    blocks = _BLOCKS.get((batch, lq, per))
    if blocks is None:
        edges = [*range(0, lq, per), lq]
        blocks = np.array(
            [(i, edges[j], edges[j + 1]) for i in range(batch) for j in range(len(edges) - 1)],
            np.int64,
        )
        if len(_BLOCKS) >= 1024:  # requests of ever new shapes: start again
            _BLOCKS.clear()
        _BLOCKS[(batch, lq, per)] = blocks
    # per operand: inner batch, row and outer batch strides (_stack: outer, inner, row)
    dims = np.array(
        [lq, lk, d, dv, inner, *(x for o, i, r in strides for x in (i, r, o))], np.int64
    )
    native_threads.enter(intra_pool().threads if work >= _SPLIT_MIN_MACS else 1)
    fn(addresses(q, k, v, y), dims, blocks, EXP_CONSTS, alpha)
    return y


#: Attention of fewer multiply-adds than this runs its blocks on the caller alone (a split
#: costs ~4 µs).
_SPLIT_MIN_MACS = 1 << 18
