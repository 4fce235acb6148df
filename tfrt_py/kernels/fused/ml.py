"""Kernels for the fused ops of the classic-ML pass (``fuse_ml``), in the private domain
``tfrt_py.fused``.

``PairwiseSqDist(Y, X)``: ``D[i, j] = sum_k (X[j, k] - Y[i, k]) ** 2`` for ``Y`` (M, K) and
``X`` (N, K), an (M, N) result -- what skl2onnx's nearest-neighbour Scan computes one row
of ``Y`` per iteration. The same arithmetic as the Scan body (a subtraction, a square and a
sum over the last axis: ``np.add.reduce`` as the unfused ReduceSumSquare kernel uses),
so the values are the unfused ones, bit for bit; only the Python loop is gone. With numba,
2-D float inputs of one dtype and at most ``pairwise_jit.MAX_K`` features take the
compiled kernel (the same sums in the same order, ten times faster; ``X`` transposed once
at load when it is a constant, as skl2onnx's training set is); otherwise work is done in
chunks of rows of ``Y`` so the broadcast temporary stays under ``CHUNK_ELEMENTS`` elements
whatever the batch. No ``out=``: returns a fresh array. Any thread.

``StringIds(x)`` (``compiler/encode_strings.py``): each element of a string tensor as its
index in the attribute ``vocab`` (a tuple of str), -1 for anything else, int64 of ``x``'s
shape; a tensor that is not of strings is the TypeError the OneHotEncoder it stands before
gives. The native tier calls ``string_ids`` at its entry instead (``encoder``).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np

from ..base import Cost, KernelContext
from ..ml.pairwise_jit import MAX_K, pairwise_sq_dist_f
from ..registry import KernelRegistry
from .domain import DOMAIN
from .string_ids_jit import VocabTable, lookup

__all__ = ["CHUNK_ELEMENTS", "JOINED_MIN", "encoder", "pairwise_sq_dist", "register_kernels"]

#: The broadcast temporary's size bound (elements): 256 KiB of float32, cache-resident.
CHUNK_ELEMENTS = 1 << 16
#: ``encoder`` joins this many strings or more for the compiled lookup (a dict's per string
#: is cheaper than the join, encode and call on a few).
JOINED_MIN = 16


def _compiled_fits(y: np.ndarray, x: np.ndarray) -> bool:
    return (
        y.ndim == 2
        and x.ndim == 2
        and 0 < y.shape[1] == x.shape[1] <= MAX_K
        and y.dtype == x.dtype
        and y.dtype in (np.float32, np.float64)
    )


_ASK = object()


def pairwise_sq_dist(
    y: np.ndarray, x: np.ndarray, xt: np.ndarray | None = None, compiled: Any = _ASK
) -> np.ndarray:
    """(M, N) squared distances between the rows of ``y`` (M, K) and of ``x`` (N, K)
    (``K`` may broadcast as in ONNX ``Sub``); ``xt``: ``x`` transposed, C-contiguous, when
    the caller made it once; ``compiled``: ``pairwise_sq_dist_f()`` as the caller resolved
    it at load (None: the NumPy path), asked here when not given."""
    m, n = y.shape[0], x.shape[0]
    k = np.broadcast_shapes(y.shape[1:], x.shape[1:])[0]
    dtype = np.result_type(y, x)
    out = np.empty((m, n), dtype)
    if m == 0 or n == 0:
        return out
    fn = pairwise_sq_dist_f() if compiled is _ASK else compiled
    if fn is not None and _compiled_fits(y, x):
        fn(np.ascontiguousarray(y), np.ascontiguousarray(x.T) if xt is None else xt, out)
        return out
    rows = max(1, min(m, CHUNK_ELEMENTS // max(1, n * k)))
    buf = np.empty((rows, n, k), dtype)
    xs = x[None, :, :]
    for i0 in range(0, m, rows):
        i1 = min(m, i0 + rows)
        b = buf[: i1 - i0]
        np.subtract(xs, y[i0:i1, None, :], out=b)
        np.multiply(b, b, out=b)
        np.add.reduce(b, axis=2, dtype=dtype, out=out[i0:i1])
    return out


def _pairwise(ctx: KernelContext) -> Any:
    fn = pairwise_sq_dist_f()  # at load: a call reads no environment
    x_const = ctx.const_input(1)
    if x_const is None or x_const.ndim != 2 or x_const.dtype not in (np.float32, np.float64):

        def pairwise(y: np.ndarray, x: np.ndarray) -> np.ndarray:
            return pairwise_sq_dist(y, x, None, fn)

        return pairwise
    xt = np.ascontiguousarray(x_const.T)  # the training set, transposed once at load

    def pairwise_const(y: np.ndarray, x: np.ndarray) -> np.ndarray:
        return pairwise_sq_dist(y, x, xt if x is x_const else None, fn)

    return pairwise_const


def _pairwise_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    if len(ins) < 2 or not outs or len(ins[0]) != 2:
        return Cost(0.0, 0.0)
    d = float(np.prod(outs[0]))
    k = float(ins[0][1])
    return Cost(3.0 * d * k, 4.0 * (float(np.prod(ins[0])) + float(np.prod(ins[1])) + d))


def encoder(vocab: tuple[str, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """``x -> int64 ids`` for ``StringIds`` of ``vocab`` (see the module docstring): from
    ``JOINED_MIN`` strings on, all str and none holding NUL, in one compiled pass over
    their joined UTF-8 (``string_ids_jit``), else a dict lookup each."""
    get = {s: i for i, s in enumerate(vocab)}.get
    table = VocabTable(vocab)

    def string_ids(x: np.ndarray) -> np.ndarray:
        if x.dtype != np.dtype(object) and x.dtype.kind not in "US":
            raise TypeError(f"OneHotEncoder categories do not match input dtype {x.dtype}")
        flat = x.reshape(-1).tolist()
        n = len(flat)
        if n >= JOINED_MIN and (fn := lookup()) is not None:
            try:
                text = "\x00".join(flat)
            except TypeError:  # not all str: each looked up (none of them matches)
                text = ""
            if text.count("\x00") == n - 1:
                out = np.empty(n, np.int64)
                fn(np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8),
                   table.blob, table.offs, table.slots, out)  # fmt: skip
                return out.reshape(x.shape)
        return np.fromiter(map(get, flat, repeat(-1)), np.int64, n).reshape(x.shape)

    return string_ids


def _string_ids(ctx: KernelContext) -> Any:
    vocab = ctx.attr("vocab")
    if not all(isinstance(s, str) for s in vocab):
        raise ctx.unsupported("StringIds takes a vocabulary of str")
    return encoder(tuple(vocab))


def _string_ids_cost(ctx: KernelContext, ins: list[tuple[int, ...]],
                     outs: list[tuple[int, ...]]) -> Cost:  # fmt: skip
    n = float(np.prod(ins[0])) if ins else 0.0
    return Cost(20.0 * n, 16.0 * n)


def register_kernels(registry: KernelRegistry) -> None:
    """Register the classic-ML pass's fused ops into ``registry``"""
    registry.add("PairwiseSqDist", _pairwise, domain=DOMAIN, cost=_pairwise_cost)
    registry.add("StringIds", _string_ids, domain=DOMAIN, cost=_string_ids_cost)
