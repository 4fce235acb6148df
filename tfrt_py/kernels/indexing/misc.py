"""Kernels (indexing): OneHot, Unique, ReverseSequence, Trilu."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _one_hot(ctx: KernelContext) -> ComputeFn:
    """OneHot(indices, depth, values=[off, on]) -> values' dtype, rank+1, the new dim of size
    ``depth`` inserted at ``axis`` (default -1). Indices in [-depth, -1] count from the end;
    others out of range give an all-off row. Float indices truncate."""
    axis = int(ctx.attr("axis", -1))

    def one_hot(indices: np.ndarray, depth: np.ndarray, values: np.ndarray) -> np.ndarray:
        d = int(depth.reshape(-1)[0])
        idx = indices if indices.dtype == np.int64 else indices.astype(np.int64)
        idx = np.where(idx < 0, idx + d, idx)
        r = idx.ndim
        a = axis + r + 1 if axis < 0 else axis
        ar = np.arange(d).reshape((d,) + (1,) * (r - a))
        hot = np.expand_dims(idx, a) == ar
        return values.reshape(-1)[hot.view(np.uint8)]

    return one_hot


def _unique_axis(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sorted unique sub-tensors along ``axis``: (y, first indices, inverse, counts)."""
    moved = np.moveaxis(x, axis, 0)
    n = moved.shape[0]
    rows = moved.reshape(n, -1)
    order = np.lexsort(rows.T[::-1]) if rows.shape[1] else np.arange(n)
    srt = rows[order]
    if n:
        new = np.ones(n, dtype=bool)
        new[1:] = np.any(srt[1:] != srt[:-1], axis=1)
    else:
        new = np.zeros(0, dtype=bool)
    starts = np.flatnonzero(new)
    first = order[starts]
    group = np.cumsum(new) - 1
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = group
    counts = np.diff(np.append(starts, n))
    return np.take(x, first, axis=axis), first, inverse, counts


def _unique(ctx: KernelContext) -> ComputeFn:
    """Unique(X) -> (Y, indices, inverse_indices, counts): unique values of flattened X, or
    unique sub-tensors along ``axis``; ascending (``sorted`` 1, default) or in order of first
    occurrence. The three index outputs are int64; inverse_indices is 1-D."""
    a = ctx.attr("axis", None)
    axis = None if a is None else int(a)
    is_sorted = bool(ctx.attr("sorted", 1))
    n_out = ctx.n_outputs

    def unique(x: np.ndarray) -> Any:
        if axis is None:
            y, first, inv, cnt = np.unique(
                x.reshape(-1), return_index=True, return_inverse=True, return_counts=True
            )
            ax = 0
        else:
            ax = axis + x.ndim if axis < 0 else axis
            y, first, inv, cnt = _unique_axis(x, ax)
        if not is_sorted:
            order = np.argsort(first, kind="stable")
            y = np.take(y, order, axis=ax)
            first = first[order]
            cnt = cnt[order]
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            inv = rank[inv]
        outs = (
            y,
            first.astype(np.int64, copy=False),
            inv.reshape(-1).astype(np.int64, copy=False),
            cnt.astype(np.int64, copy=False),
        )
        return outs[0] if n_out == 1 else outs[:n_out]

    return unique


def _reverse_sequence(ctx: KernelContext) -> ComputeFn:
    """ReverseSequence(input, sequence_lens) -> for each batch b (``batch_axis``, default 1)
    the first sequence_lens[b] entries along ``time_axis`` (default 0) reversed, the rest
    copied."""
    batch_axis = int(ctx.attr("batch_axis", 1))
    time_axis = int(ctx.attr("time_axis", 0))

    def reverse_sequence(x: np.ndarray, sequence_lens: np.ndarray) -> np.ndarray:
        nd = x.ndim
        ba = batch_axis + nd if batch_axis < 0 else batch_axis
        ta = time_axis + nd if time_axis < 0 else time_axis
        t = np.arange(x.shape[ta])
        lens = sequence_lens.astype(np.int64, copy=False)[:, None]
        src = np.where(t < lens, lens - 1 - t, t)  # (batch, time)
        if ba > ta:
            src = src.T
        shp = [1] * nd
        shp[ba] = x.shape[ba]
        shp[ta] = x.shape[ta]
        idx = src.reshape(shp)
        return np.take_along_axis(x, np.broadcast_to(idx, x.shape), axis=ta)

    return reverse_sequence


def _trilu(ctx: KernelContext) -> ComputeFn:
    """Trilu(x[, k]) -> new array keeping the upper (``upper`` 1, default) or lower triangle
    of the last two dims, relative to diagonal k (default 0); the rest zero."""
    upper = bool(ctx.attr("upper", 1))
    ck = ctx.const_input(1)
    const_k = None if ck is None else int(ck.reshape(-1)[0])
    fn = np.triu if upper else np.tril

    def trilu(x: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
        kk = const_k if const_k is not None else (0 if k is None else int(k.reshape(-1)[0]))
        return fn(x, kk)

    return trilu


def register_kernels(registry: KernelRegistry) -> None:
    """Register OneHot, Unique, ReverseSequence, Trilu."""
    registry.add("OneHot", _one_hot, since=9)
    registry.add("Unique", _unique, since=11)
    registry.add("ReverseSequence", _reverse_sequence, since=10)
    registry.add("Trilu", _trilu, since=14)
