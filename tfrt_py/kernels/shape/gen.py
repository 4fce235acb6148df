"""Kernels (shape): tensor generators and block rearrangements.

ConstantOfShape, Range, EyeLike, Dropout (inference, plus seeded training masks),
DepthToSpace, SpaceToDepth.
"""

from __future__ import annotations

from math import ceil
from typing import Any

import numpy as np

from ..base import OUT, ComputeFn, KernelContext
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _constant_of_shape(ctx: KernelContext) -> ComputeFn:
    """ConstantOfShape(shape) -> new array of that shape filled with the one-element tensor
    attribute ``value`` (default float32 0), in its dtype."""
    v = ctx.attr("value", None)
    if v is not None and not isinstance(v, np.ndarray) and hasattr(v, "data_type"):
        from onnx import numpy_helper  # a raw TensorProto (frontends normally convert it)

        v = numpy_helper.to_array(v)
    value = np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)
    if value.size != 1:
        raise ctx.unsupported("attribute 'value' must hold exactly one element")
    dtype = value.dtype
    scalar = value[0]
    zero = dtype.kind != "O" and not scalar

    def constant_of_shape(shape: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None:
            out.fill(scalar)
            return out
        s = shape.tolist()
        if zero:
            return np.zeros(s, dtype)
        return np.full(s, scalar, dtype)

    return constant_of_shape


_INT_KINDS = "iu"


def _range(ctx: KernelContext) -> ComputeFn:
    """Range(start, limit, delta) -> 1-D array of max(ceil((limit-start)/delta), 0) values
    start + i*delta, in the inputs' dtype. Float16/bfloat16 are computed in float32 or wider
    (``stash_type`` 1 from opset 27; harmless before)."""

    def range_(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
        dt = start.dtype
        s, lim, d = start.item(), limit.item(), delta.item()
        if dt.kind in _INT_KINDS:
            return np.arange(s, lim, d, dtype=dt)
        s, lim, d = float(s), float(lim), float(d)
        n = max(ceil((lim - s) / d), 0)
        return (s + np.arange(n, dtype=np.float64) * d).astype(dt)

    return range_


def _eye_like(ctx: KernelContext) -> ComputeFn:
    """EyeLike(x) -> new 2-D array of x's shape with ones on diagonal ``k``; dtype from the
    ``dtype`` attribute, else x's."""
    k = int(ctx.attr("k", 0))
    d = ctx.attr("dtype", None)
    dtype = None if d is None else ctx.elem_dtype(d, "dtype")

    def eye_like(x: np.ndarray) -> np.ndarray:
        if x.ndim != 2:
            raise ValueError(f"EyeLike expects a 2-D input, got shape {x.shape}")
        return np.eye(x.shape[0], x.shape[1], k, dtype=x.dtype if dtype is None else dtype)

    return eye_like


def _dropout(ctx: KernelContext) -> ComputeFn:
    """Dropout(data[, ratio, training_mode]) -> (output[, mask]).

    Inference (no or false ``training_mode``, ratio 0, opsets before 12): output is ``data``
    itself and mask all True. Training mode drops with probability ``ratio`` and scales by
    1/(1-ratio); with a ``seed`` each call draws the same mask from
    ``numpy.random.RandomState(seed).uniform`` (as ONNX's reference), else a fresh generator.
    The mask is bool from opset 10, data's dtype before.
    """
    n_out = ctx.n_outputs
    want_mask = ctx.has_output(1)
    mask_dtype = np.dtype(bool) if ctx.opset >= 10 else None

    def infer(x: np.ndarray, *_: Any) -> Any:
        if n_out == 1:
            return x
        if not want_mask:
            return x, None
        return x, np.ones(x.shape, x.dtype if mask_dtype is None else mask_dtype)

    if ctx.opset < 12 or not ctx.has_input(2):
        return infer
    tm = ctx.const_input(2)
    if tm is not None and not bool(tm):
        return infer
    seed = ctx.attr("seed", None)
    seed = None if seed is None else int(seed)

    def dropout(
        x: np.ndarray, ratio: np.ndarray | None = None, training_mode: np.ndarray | None = None
    ) -> Any:
        r = 0.5 if ratio is None else float(ratio)
        if training_mode is None or not bool(training_mode) or r == 0.0:
            return infer(x)
        if seed is not None:
            u = np.random.RandomState(seed).uniform(0.0, 1.0, x.shape)
        else:
            u = np.random.default_rng().random(x.shape)
        mask = u >= r
        y = x * mask
        y *= np.asarray(1.0 / (1.0 - r), dtype=x.dtype)
        if n_out == 1:
            return y
        return y, (mask if want_mask else None)

    return dropout


def _depth_to_space(ctx: KernelContext) -> ComputeFn:
    """DepthToSpace(x: N,C,H,W) -> new N, C/b^2, H*b, W*b array; ``mode`` DCR (default) or
    CRD (opset 11+)."""
    bs = int(ctx.attr("blocksize"))
    mode = ctx.attr("mode", "DCR") if ctx.opset >= 11 else "DCR"
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("DCR", "CRD"):
        raise ctx.unsupported(f"mode {mode!r}")
    dcr = mode == "DCR"

    def depth_to_space(x: np.ndarray) -> np.ndarray:
        b, c, h, w = x.shape
        c2 = c // (bs * bs)
        if dcr:
            t = x.reshape(b, bs, bs, c2, h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            t = x.reshape(b, c2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
        return t.reshape(b, c2, h * bs, w * bs)

    return depth_to_space


def _space_to_depth(ctx: KernelContext) -> ComputeFn:
    """SpaceToDepth(x: N,C,H,W) -> new N, C*b^2, H/b, W/b array; ``mode`` DCR (default) or
    CRD (opset 28+)."""
    bs = int(ctx.attr("blocksize"))
    mode = ctx.attr("mode", "DCR")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("DCR", "CRD"):
        raise ctx.unsupported(f"mode {mode!r}")
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)

    def space_to_depth(x: np.ndarray) -> np.ndarray:
        b, c, h, w = x.shape
        t = x.reshape(b, c, h // bs, bs, w // bs, bs).transpose(perm)
        return t.reshape(b, c * bs * bs, h // bs, w // bs)

    return space_to_depth


def register_kernels(registry: KernelRegistry) -> None:
    """Register ConstantOfShape, Range, EyeLike, Dropout, DepthToSpace, SpaceToDepth."""
    registry.add("ConstantOfShape", _constant_of_shape, since=9, flags=OUT)
    registry.add("Range", _range, since=11)
    registry.add("EyeLike", _eye_like, since=9)
    registry.add("Dropout", _dropout, since=1)
    registry.add("DepthToSpace", _depth_to_space, since=1)
    registry.add("SpaceToDepth", _space_to_depth, since=1)
