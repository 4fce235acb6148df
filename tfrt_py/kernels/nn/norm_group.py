"""Kernels (nn): InstanceNormalization, GroupNormalization, LRN, MeanVarianceNormalization.

* InstanceNormalization: per (n, c) over the spatial axes,
  ``y = (x - mean) / sqrt(var + eps) * scale[c] + B[c]``; the per-channel affine is folded
  into one per-row multiply-add.
* GroupNormalization: per (n, group) over the group's channels and spatial axes; scale and
  bias are per group in opset 18 and per channel from opset 21 (which also adds
  ``stash_type``, the precision of the statistics).
* LRN: ``y = x / (bias + alpha / size * sum of x^2 over a channel window) ^ beta``, the
  window ``[c - floor((size-1)/2), c + ceil((size-1)/2)]`` clipped to the channels.
* MeanVarianceNormalization: ``(x - mean) / (std + 1e-9)`` over ``axes`` (default
  [0, 2, 3]), as the ONNX function body computes it.

Outputs keep X's dtype; all accept ``out=``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import OUT, ComputeFn, KernelContext
from ..common import float_dtype, ones_vector, stash_dtype
from ..registry import KernelRegistry

__all__ = ["register_kernels", "row_stats"]

_sum = np.add.reduce


def row_stats(xs: np.ndarray, eps: float, d_out: Any = None) -> tuple[Any, Any, Any]:
    """For a 2-D ``xs``: (xs - row mean, row mean [rows, 1], 1/sqrt(row var + eps) [rows, 1]).

    The centered rows are written into ``d_out`` when given (same shape and dtype).
    """
    cols = xs.shape[1]
    if xs.dtype.char in "fd" and cols:  # BLAS row sums: much faster than add.reduce
        mean = np.dot(xs, ones_vector(cols, xs.dtype.char)).reshape(-1, 1)
    else:
        mean = _sum(xs, axis=1, keepdims=True)
    mean *= 1.0 / max(cols, 1)
    d = np.subtract(xs, mean, out=d_out)
    var = np.einsum("ij,ij->i", d, d).reshape(-1, 1)
    var *= 1.0 / max(cols, 1)
    var += eps
    np.sqrt(var, out=var)
    inv = np.reciprocal(var, out=var)
    return d, mean, inv


def _stats_dtype(dt: np.dtype) -> np.dtype:
    """The dtype statistics are computed in: float32 for float16, float64 for non-floats."""
    return np.dtype(np.float32) if dt == np.float16 else float_dtype(dt)


def _finish(y: np.ndarray, dt: np.dtype, out: np.ndarray | None) -> np.ndarray:
    if out is not None:
        np.copyto(out, y, casting="unsafe")
        return out
    return y if y.dtype == dt else y.astype(dt)


def _instance_normalization(ctx: KernelContext) -> ComputeFn:
    """InstanceNormalization: ``fn(input, scale, B, out=None) -> y``."""
    eps = float(ctx.attr("epsilon", 1e-5))

    def instance_norm(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        n, c = x.shape[0], x.shape[1]
        xs = x.reshape(n * c, -1)
        cdt = _stats_dtype(x.dtype)
        if xs.dtype != cdt:
            xs = xs.astype(cdt)
        d, _, inv = row_stats(xs, eps)
        a = inv.reshape(n, c) * scale.astype(d.dtype, copy=False)
        d *= a.reshape(-1, 1)
        d += np.broadcast_to(bias.astype(d.dtype, copy=False), (n, c)).reshape(-1, 1)
        return _finish(d.reshape(x.shape), x.dtype, out)

    return instance_norm


def _group_normalization(ctx: KernelContext) -> ComputeFn:
    """GroupNormalization: ``fn(X, scale, bias, out=None) -> Y``."""
    eps = float(ctx.attr("epsilon", 1e-5))
    groups = int(ctx.attr("num_groups"))
    per_channel = ctx.opset >= 21
    stash = stash_dtype(ctx) if per_channel else None
    if groups <= 0:
        raise ctx.unsupported(f"num_groups={groups}")

    def group_norm(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        n, c = x.shape[0], x.shape[1]
        if c % groups:
            raise ValueError(f"GroupNormalization: {c} channels not divisible by {groups}")
        cdt = stash if stash is not None else _stats_dtype(x.dtype)
        xs = x.reshape(n * groups, -1)
        if xs.dtype != cdt:
            xs = xs.astype(cdt)
        d, _, inv = row_stats(xs, eps)
        d *= inv
        y = d.reshape(n, c, -1)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        if per_channel:
            s, b = scale.reshape(c, 1), bias.reshape(c, 1)
        else:
            s = np.repeat(scale, c // groups).reshape(c, 1)
            b = np.repeat(bias, c // groups).reshape(c, 1)
        y *= s.astype(y.dtype, copy=False)
        y += b.astype(y.dtype, copy=False)
        return _finish(y.reshape(x.shape), x.dtype, out)

    return group_norm


def _lrn(ctx: KernelContext) -> ComputeFn:
    """LRN: ``fn(X, out=None) -> Y`` (local response normalization across channels)."""
    alpha = float(ctx.attr("alpha", 1e-4))
    beta = float(ctx.attr("beta", 0.75))
    bias = float(ctx.attr("bias", 1.0))
    size = int(ctx.attr("size"))
    lo = math.floor((size - 1) / 2)
    hi = math.ceil((size - 1) / 2)

    def lrn(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        c = x.shape[1]
        sq = np.square(x)
        acc = sq.copy()
        for off in range(-lo, hi + 1):
            if off == 0 or abs(off) >= c:
                continue
            if off > 0:  # channel i gathers channel i + off
                acc[:, : c - off] += sq[:, off:]
            else:
                acc[:, -off:] += sq[:, : c + off]
        acc *= alpha / size
        acc += bias
        np.power(acc, -beta, out=acc)
        return np.multiply(x, acc, out=out)

    return lrn


def _mean_variance_normalization(ctx: KernelContext) -> ComputeFn:
    """MeanVarianceNormalization: ``fn(X, out=None) -> (X - mean) / (std + 1e-9)``."""
    axes = tuple(int(a) for a in ctx.attr("axes", (0, 2, 3)))

    def mvn(x: np.ndarray, out: np.ndarray | None = None) -> Any:
        xf = x.astype(np.float32) if x.dtype == np.float16 else x
        m = np.mean(xf, axis=axes, keepdims=True)
        d = xf - m
        std = np.sqrt(np.mean(np.square(d), axis=axes, keepdims=True))
        std += 1e-9
        d /= std
        return _finish(d, x.dtype, out)

    return mvn


def register_kernels(registry: KernelRegistry) -> None:
    """Register InstanceNormalization, GroupNormalization, LRN, MeanVarianceNormalization."""
    registry.add("InstanceNormalization", _instance_normalization, since=1, flags=OUT)
    registry.add("GroupNormalization", _group_normalization, since=18, flags=OUT)
    registry.add("LRN", _lrn, since=1, flags=OUT)
    registry.add("MeanVarianceNormalization", _mean_variance_normalization, since=9, flags=OUT)
