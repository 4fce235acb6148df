"""Kernels (nn): DeformConv.

Vectorised deformable convolution for 2-D inputs: the sampling points (window position +
learned offset) are bilinearly interpolated from the input (zero outside it) into an
im2col matrix, scaled by the optional mask, then multiplied by the grouped weights in one
matmul. Base sampling positions are computed once per shape and memoised.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import ShapeMemo, compute_dtype
from ..registry import KernelRegistry
from .conv_common import attr_ints

__all__ = ["register_kernels"]


def _deform_conv(ctx: KernelContext) -> ComputeFn:
    """DeformConv(X, W, offset, B?, mask?) -> Y for 2-D X (N, C, H, W).

    ``offset`` is (N, offset_group*kH*kW*2, oH, oW) with (dh, dw) pairs per kernel
    position; ``mask`` (N, offset_group*kH*kW, oH, oW) scales each sample."""
    group = int(ctx.attr("group", 1))
    og = int(ctx.attr("offset_group", 1))
    k_attr = attr_ints(ctx, "kernel_shape")
    s_attr = attr_ints(ctx, "strides")
    d_attr = attr_ints(ctx, "dilations")
    p_attr = attr_ints(ctx, "pads")
    if group < 1 or og < 1:
        raise ctx.unsupported(f"group={group}, offset_group={og}")
    t = ctx.input_type(0)
    if t is not None and t.rank is not None and t.rank != 4:
        raise ctx.unsupported("only 2-D DeformConv (4-D X) is supported")
    bases: ShapeMemo[Any, tuple[np.ndarray, np.ndarray]] = ShapeMemo()

    def base_pos(kernel: tuple[int, int], out_sp: tuple[int, int]) -> tuple[Any, Any]:
        key = (kernel, out_sp)
        b = bases.get(key)
        if b is None:
            s = s_attr or (1, 1)
            d = d_attr or (1, 1)
            p = p_attr or (0, 0, 0, 0)
            kh = np.arange(kernel[0])[:, None, None, None] * d[0]
            kw = np.arange(kernel[1])[None, :, None, None] * d[1]
            oh = np.arange(out_sp[0])[None, None, :, None] * s[0] - p[0]
            ow = np.arange(out_sp[1])[None, None, None, :] * s[1] - p[1]
            b = bases.put(key, ((kh + oh).astype(np.float64), (kw + ow).astype(np.float64)))
        return b

    def deform_conv(
        x: np.ndarray, w: np.ndarray, offset: np.ndarray, b: Any = None, mask: Any = None
    ) -> np.ndarray:
        if x.ndim != 4:
            raise ValueError(f"DeformConv {ctx.node_name!r}: only 2-D inputs, got {x.shape}")
        n, c, h, wd = x.shape
        m, cg = w.shape[:2]
        kernel = (int(w.shape[2]), int(w.shape[3])) if k_attr is None else k_attr
        oh, ow = offset.shape[2:]
        if c != cg * group or m % group or c % og:
            raise ValueError(f"DeformConv {ctx.node_name!r}: X {x.shape}, W {w.shape}")
        dt = x.dtype
        cdt = compute_dtype(dt)
        k = kernel[0] * kernel[1]
        bh, bw = base_pos(kernel, (oh, ow))  # type: ignore[arg-type]
        off = offset.reshape(n, og, kernel[0], kernel[1], 2, oh, ow).astype(np.float64)
        ph = bh + off[:, :, :, :, 0]  # (n, og, kh, kw, oh, ow)
        pw = bw + off[:, :, :, :, 1]
        h0 = np.floor(ph)
        w0 = np.floor(pw)
        lh = ph - h0
        lw = pw - w0
        h0i = h0.astype(np.int64)
        w0i = w0.astype(np.int64)
        xg = x.astype(cdt, copy=False).reshape(n, og, c // og, h * wd)
        cols = np.zeros((n, og, c // og, k * oh * ow), cdt)
        mk = None
        if mask is not None:
            mk = mask.reshape(n, og, k * oh * ow).astype(cdt)
        for dh, dw in ((0, 0), (0, 1), (1, 0), (1, 1)):
            hi = h0i + dh
            wi = w0i + dw
            wt = (lh if dh else 1 - lh) * (lw if dw else 1 - lw)
            ok = (hi >= 0) & (hi < h) & (wi >= 0) & (wi < wd)
            idx = np.where(ok, hi * wd + wi, 0).reshape(n, og, 1, -1)
            wt = np.where(ok, wt, 0.0).reshape(n, og, -1).astype(cdt)
            if mk is not None:
                wt *= mk
            vals = np.take_along_axis(xg, np.broadcast_to(idx, (n, og, c // og, idx.shape[-1])), 3)
            cols += vals * wt[:, :, None, :]
        cols = cols.reshape(n, group, cg * k, oh * ow)
        w2 = w.reshape(group, m // group, cg * k).astype(cdt, copy=False)
        y = np.matmul(w2, cols).reshape(n, m, oh, ow)
        if b is not None:
            y += b.astype(cdt).reshape(-1, 1, 1)
        return y.astype(dt, copy=False)

    return deform_conv


def register_kernels(registry: KernelRegistry) -> None:
    """Register DeformConv."""
    registry.add("DeformConv", _deform_conv, since=19)
