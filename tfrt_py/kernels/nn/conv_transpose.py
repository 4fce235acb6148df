"""Kernels (nn): ConvTranspose and Col2Im.

Both are one matmul (ConvTranspose only) followed by col2im: for each kernel position, one
strided slice-add of the column block into the output. The slices, pads and output shape
are computed once per input shape and memoised; weights are rearranged at load when
constant. float16 computes in float32.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import ShapeMemo, compute_dtype
from ..registry import KernelRegistry
from .conv_common import Spatial, attr_ints, col2im_slices, parse_spatial

__all__ = ["register_kernels"]

_Slices = list[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]


class _TPlan(NamedTuple):
    x_shape: tuple[int, ...]  # X viewed as (N, group, C/group, prod(I)) or (C, prod(I))
    wt_shape: tuple[int, ...]
    cols_shape: tuple[int, ...]  # the matmul result viewed as (N, M, *K, *I)
    out_shape: tuple[int, ...]
    slices: list[tuple[tuple[Any, ...], tuple[Any, ...]]]  # (cols index, out index)


def _full_index(s: _Slices) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    all2 = (slice(None), slice(None))
    return [((*all2, *k, *b), (*all2, *o)) for k, b, o in s]


def _transposed_weights(w: np.ndarray, group: int, cdt: np.dtype) -> np.ndarray:
    """W (C, M/group, *kernel) as the matmul's left operand: (M/group*prod(kernel), C) for
    one group, else (group, M/group*prod(kernel), C/group), contiguous in ``cdt``."""
    c, mg = w.shape[:2]
    ksize = int(np.prod(w.shape[2:]))
    wt = w.reshape(group, c // group, mg * ksize).transpose(0, 2, 1)
    if group == 1:
        wt = wt[0]
    return np.ascontiguousarray(wt, dtype=cdt)


def _output_geometry(
    sp: Spatial,
    in_sp: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dil: tuple[int, ...],
    pads: tuple[int, ...],
    out_pad_attr: tuple[int, ...] | None,
    out_shape_attr: tuple[int, ...] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pads at the beginning, output spatial shape) of a ConvTranspose: from
    ``output_shape`` or SAME_* auto_pad when given, else from the pads."""
    r = len(in_sp)
    opad = out_pad_attr if out_pad_attr is not None else (0,) * r
    full = [strides[i] * (in_sp[i] - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1 for i in range(r)]
    if out_shape_attr is not None or sp.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape_attr is not None:
            out_sp = tuple(out_shape_attr[-r:])
        else:
            out_sp = tuple(in_sp[i] * strides[i] for i in range(r))
        total = [full[i] - out_sp[i] for i in range(r)]
        if sp.auto_pad == "SAME_UPPER":
            return tuple(t // 2 for t in total), out_sp
        return tuple(t - t // 2 for t in total), out_sp
    if sp.auto_pad == "VALID":
        pads = (0,) * (2 * r)
    return tuple(pads[:r]), tuple(full[i] - pads[i] - pads[i + r] for i in range(r))


def _transpose_plan(
    ctx: KernelContext,
    sp: Spatial,
    group: int,
    out_pad_attr: tuple[int, ...] | None,
    out_shape_attr: tuple[int, ...] | None,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
) -> _TPlan:
    """The plan of one (X, W) shape pair; ValueError when they do not fit."""
    r = len(x_shape) - 2
    n, c = x_shape[:2]
    if len(w_shape) != r + 2 or w_shape[0] != c or c % group:
        raise ValueError(f"ConvTranspose {ctx.node_name!r}: X {x_shape}, W {w_shape}")
    kernel, strides, dil, pads = sp.resolve(w_shape[2:])
    if tuple(kernel) != tuple(w_shape[2:]):
        raise ValueError(f"ConvTranspose {ctx.node_name!r}: kernel_shape {kernel} != W")
    in_sp = x_shape[2:]
    begin, out_sp = _output_geometry(
        sp, in_sp, kernel, strides, dil, pads, out_pad_attr, out_shape_attr
    )
    mg = w_shape[1]
    m = mg * group
    ksize = int(np.prod(kernel))
    isz = int(np.prod(in_sp))
    cg = c // group
    if group == 1:
        xs: tuple[int, ...] = (cg, isz) if n == 1 else (n, cg, isz)
        wts: tuple[int, ...] = (mg * ksize, cg)
    else:
        xs = (n, group, cg, isz)
        wts = (group, mg * ksize, cg)
    sl = col2im_slices(in_sp, out_sp, kernel, strides, dil, begin)
    return _TPlan(xs, wts, (n, m, *kernel, *in_sp), (n, m, *out_sp), _full_index(sl))


def _conv_transpose(ctx: KernelContext) -> ComputeFn:
    """ConvTranspose(X, W, B?) -> Y: the gradient of Conv. W is (C, M/group, *kernel).

    Output size: ``output_shape`` when given (pads derived from it), else
    ``stride*(in-1) + output_padding + (k-1)*dilation + 1 - pads`` (SAME_*: ``in*stride``)."""
    sp = parse_spatial(ctx)
    group = int(ctx.attr("group", 1))
    out_pad_attr = attr_ints(ctx, "output_padding")
    out_shape_attr = attr_ints(ctx, "output_shape")
    w_const = ctx.const_input(1)
    if group < 1:
        raise ctx.unsupported(f"group={group}")
    if w_const is not None and w_const.shape[0] % group:
        raise ctx.unsupported(f"weights {w_const.shape} with group={group}")
    dt0 = w_const.dtype if w_const is not None else ctx.input_dtype(0)
    wt_cache: dict[Any, np.ndarray] = {}
    if w_const is not None and dt0 is not None:
        wt_cache[np.dtype(dt0)] = _transposed_weights(w_const, group, compute_dtype(np.dtype(dt0)))
    plans: ShapeMemo[Any, _TPlan] = ShapeMemo()

    def conv_transpose(x: np.ndarray, w: np.ndarray, b: Any = None) -> np.ndarray:
        key = x.shape if w_const is not None else (x.shape, w.shape)
        plan = plans.get(key)
        if plan is None:
            plan = plans.put(
                key, _transpose_plan(ctx, sp, group, out_pad_attr, out_shape_attr, x.shape, w.shape)
            )
        dt = x.dtype
        cdt = compute_dtype(dt)
        wt = wt_cache.get(dt) if w_const is not None else None
        if wt is None:
            wt = _transposed_weights(w, group, cdt)
        cols = np.matmul(wt, x.reshape(plan.x_shape).astype(cdt, copy=False))
        cols = cols.reshape(plan.cols_shape)
        y = np.zeros(plan.out_shape, cdt)
        for ci, oi in plan.slices:
            y[oi] += cols[ci]
        if b is not None:
            y += b.astype(cdt, copy=False).reshape((-1,) + (1,) * (y.ndim - 2))
        return y if cdt == dt else y.astype(dt)

    return conv_transpose


def _col2im(ctx: KernelContext) -> ComputeFn:
    """Col2Im(input (N, C*prod(block), L), image_shape, block_shape) -> (N, C, *image_shape).

    Rearranges column blocks into an image, summing overlaps (the inverse of im2col)."""
    sp = parse_spatial(ctx)
    plans: ShapeMemo[Any, tuple[tuple[int, ...], tuple[int, ...], list[Any]]] = ShapeMemo()

    def make_plan(
        x_shape: tuple[int, ...], image: tuple[int, ...], block: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...], list[Any]]:
        r = len(image)
        _, strides, dil, pads = sp.resolve(block)
        if len(block) != r or len(x_shape) != 3:
            raise ValueError(f"Col2Im {ctx.node_name!r}: input {x_shape}, image {image}")
        ksize = int(np.prod(block))
        n, ck, L = x_shape
        if ck % ksize:
            raise ValueError(f"Col2Im {ctx.node_name!r}: {ck} not divisible by {ksize}")
        nb = tuple(
            (image[i] + pads[i] + pads[i + r] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1
            for i in range(r)
        )
        if int(np.prod(nb)) != L:
            raise ValueError(f"Col2Im {ctx.node_name!r}: {L} blocks, expected {nb}")
        c = ck // ksize
        sl = col2im_slices(nb, image, block, strides, dil, pads[:r])
        return (n, c, *block, *nb), (n, c, *image), _full_index(sl)

    def col2im(x: np.ndarray, image_shape: np.ndarray, block_shape: np.ndarray) -> np.ndarray:
        key = (x.shape, tuple(image_shape.tolist()), tuple(block_shape.tolist()))
        plan = plans.get(key)
        if plan is None:
            plan = plans.put(key, make_plan(x.shape, key[1], key[2]))
        cols_shape, out_shape, slices = plan
        dt = x.dtype
        cdt = compute_dtype(dt)
        cols = x.reshape(cols_shape)
        y = np.zeros(out_shape, cdt)
        for ci, oi in slices:
            y[oi] += cols[ci]
        return y if cdt == dt else y.astype(dt)

    return col2im


def register_kernels(registry: KernelRegistry) -> None:
    """Register ConvTranspose and Col2Im."""
    registry.add("ConvTranspose", _conv_transpose, since=1)
    registry.add("Col2Im", _col2im, since=18)
