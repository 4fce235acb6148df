"""Kernels (reduce): index-producing and scan reductions (ArgMax, ArgMin, TopK, CumSum, CumProd).

* ArgMax/ArgMin: ``axis`` (default 0), ``keepdims`` (default 1), ``select_last_index``
  (opset 12+); int64 output; ties give the first (or last) index.
* TopK: ``k`` an attribute before opset 10, the second input (int64 [1]) from 10;
  ``axis`` (default -1), ``largest`` and ``sorted`` (opset 11+). Outputs (values, int64
  indices); equal values keep the lower index first, as the spec requires. Always sorted
  (allowed when ``sorted=0``).
* CumSum (11+) / CumProd (26+): ``axis`` a scalar input, ``exclusive`` and ``reverse``
  attributes; the output keeps the input dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import const_ints
from ..registry import KernelRegistry
from .topk_jit import MAX_K as TOPK_JIT_MAX_K
from .topk_jit import topk_rows

__all__ = ["register_kernels"]


def _arg_max_min(ctx: KernelContext) -> ComputeFn:
    """ArgMax/ArgMin: ``fn(data) -> int64 indices`` along ``axis``."""
    axis = int(ctx.attr("axis", 0))
    kd = bool(ctx.attr("keepdims", 1))
    last = bool(ctx.attr("select_last_index", 0)) if ctx.opset >= 12 else False
    arg = np.argmax if ctx.op_type == "ArgMax" else np.argmin
    int64 = np.int64

    if not last:

        def argfirst(x: np.ndarray) -> Any:
            return np.asarray(arg(x, axis=axis, keepdims=kd), dtype=int64)

        return argfirst

    def arglast(x: np.ndarray) -> Any:
        n = x.shape[axis]
        r = arg(np.flip(x, axis), axis=axis, keepdims=kd)
        return np.subtract(n - 1, r, dtype=int64)

    return arglast


#: The partition path serves axes at least this long and k at most a quarter of them, in
#: inputs this big (below, its dozen NumPy calls cost more than sorting: one 500-row axis
#: sorts in ~9 µs).
_PARTITION_MIN_N = 64
_PARTITION_MIN_SIZE = 1 << 14


def _topk_partition(x: np.ndarray, ax: int, k: int, largest: bool) -> np.ndarray | None:
    """TopK's indices without sorting the whole axis: the k-th smallest key by
    ``np.partition``, then every key below it and the first (lowest-index) keys equal to it,
    sorted stably -- the same indices as a stable full sort, ties by ascending index.
    ``None`` when it does not apply (NaNs, other dtypes): the caller sorts."""
    kind = x.dtype.kind
    if kind == "f":
        if np.isnan(x).any():
            return None
        key = np.negative(x) if largest else x
    elif kind in "iu":
        key = np.invert(x) if largest else x  # ~x reverses the order, without overflow
    else:
        return None
    key2 = np.moveaxis(key, ax, -1)
    lead = key2.shape[:-1]
    n = key2.shape[-1]
    key2 = key2.reshape(-1, n)
    kth = np.partition(key2, k - 1, axis=1)[:, k - 1 : k]
    below = key2 < kth
    tied = key2 == kth
    need = k - np.count_nonzero(below, axis=1)
    chosen = below | (tied & (np.cumsum(tied, axis=1) <= need[:, None]))
    idx = np.nonzero(chosen)[1].reshape(-1, k)  # ascending index within each row
    order = np.argsort(np.take_along_axis(key2, idx, axis=1), axis=1, kind="stable")
    idx = np.take_along_axis(idx, order, axis=1).reshape(*lead, k)
    return np.ascontiguousarray(np.moveaxis(idx, -1, ax), dtype=np.int64)


def _topk_sort(x: np.ndarray, ax: int, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    n = x.shape[ax]
    if k < 0 or k > n:
        raise ValueError(f"TopK: k={k} is out of range for axis of size {n}")
    if k > 0 and 4 * k <= n and n >= _PARTITION_MIN_N and x.size >= _PARTITION_MIN_SIZE:
        part = _topk_partition(x, ax, k, largest)
        if part is not None:
            return np.take_along_axis(x, part, axis=ax), part
    if largest:
        # Stable descending order with ties by ascending index: stable-sort the reversed
        # axis ascending, reverse the result, map reversed positions back.
        idx = np.argsort(np.flip(x, ax), axis=ax, kind="stable")
        idx = np.subtract(n - 1, np.flip(idx, ax))
    else:
        idx = np.argsort(x, axis=ax, kind="stable")
    if k != n:
        sl: list[Any] = [slice(None)] * x.ndim
        sl[ax] = slice(0, k)
        idx = idx[tuple(sl)]
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    return np.take_along_axis(x, idx, axis=ax), idx


def _topk_compiled(
    fn: Any, x: np.ndarray, ax: int, k: int, largest: bool
) -> tuple[np.ndarray, np.ndarray] | None:
    """TopK by the compiled rows (``topk_jit``) when they take it: the last axis of a
    C-contiguous float array, ``0 < k <= MAX_K``, no NaN; else None."""
    if (
        fn is None
        or ax != x.ndim - 1
        or x.dtype not in (np.float32, np.float64)
        or not 0 < k <= min(TOPK_JIT_MAX_K, x.shape[-1])
        or not x.flags.c_contiguous
    ):
        return None
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    values = np.empty((x2.shape[0], k), x.dtype)
    indices = np.empty((x2.shape[0], k), np.int64)
    if not fn(x2, k, largest, values, indices):
        return None  # a NaN: NumPy's sort order
    lead = x.shape[:-1]
    return values.reshape(*lead, k), indices.reshape(*lead, k)


def _top_k(ctx: KernelContext) -> ComputeFn:
    """TopK: ``fn(X, K=None) -> (values, indices)``; K constant -> read at load. Small k
    over the last axis of float inputs takes the compiled rows (``topk_jit``)."""
    axis = int(ctx.attr("axis", -1))
    jit = topk_rows()
    largest = bool(ctx.attr("largest", 1)) if ctx.opset >= 11 else True
    if ctx.opset < 10:
        k_static: int | None = int(ctx.attr("k"))
    else:
        kc = const_ints(ctx, 1)
        k_static = kc[0] if kc else None

    if k_static is not None:
        k0 = k_static

        def topk_static(x: np.ndarray, k: Any = None) -> Any:
            ax = axis % x.ndim
            return _topk_compiled(jit, x, ax, k0, largest) or _topk_sort(x, ax, k0, largest)

        return topk_static

    def topk_dynamic(x: np.ndarray, k: Any = None) -> Any:
        ax, kk = axis % x.ndim, int(np.asarray(k).reshape(-1)[0])
        return _topk_compiled(jit, x, ax, kk, largest) or _topk_sort(x, ax, kk, largest)

    return topk_dynamic


def _cum_sum_prod(ctx: KernelContext) -> ComputeFn:
    """CumSum/CumProd: ``fn(x, axis) -> y`` (same dtype as x)."""
    exclusive = bool(ctx.attr("exclusive", 0))
    reverse = bool(ctx.attr("reverse", 0))
    is_sum = ctx.op_type == "CumSum"
    scan = np.cumsum if is_sum else np.cumprod
    first = 0 if is_sum else 1
    ac = const_ints(ctx, 1)
    axis_static = ac[0] if ac else None

    def cum(x: np.ndarray, axis: Any = None) -> Any:
        ax = axis_static if axis_static is not None else int(np.asarray(axis).reshape(-1)[0])
        ax %= max(x.ndim, 1)
        if reverse:
            x = np.flip(x, ax)
        if exclusive:
            r = np.empty(x.shape, dtype=x.dtype)
            head: list[Any] = [slice(None)] * x.ndim
            tail: list[Any] = [slice(None)] * x.ndim
            src: list[Any] = [slice(None)] * x.ndim
            head[ax] = slice(0, 1)
            tail[ax] = slice(1, None)
            src[ax] = slice(0, -1)
            r[tuple(head)] = first
            scan(x[tuple(src)], axis=ax, dtype=x.dtype, out=r[tuple(tail)])
        else:
            r = scan(x, axis=ax, dtype=x.dtype)
        if reverse:
            r = np.flip(r, ax)
        return r

    return cum


def register_kernels(registry: KernelRegistry) -> None:
    """Register ArgMax, ArgMin, TopK, CumSum, CumProd."""
    registry.add("ArgMax", _arg_max_min, since=1)
    registry.add("ArgMin", _arg_max_min, since=1)
    registry.add("TopK", _top_k, since=1)
    registry.add("CumSum", _cum_sum_prod, since=11)
    registry.add("CumProd", _cum_sum_prod, since=26)
