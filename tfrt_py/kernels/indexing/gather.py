"""Kernels (indexing): selecting elements by position.

Slice (strided view), Gather (view for a constant scalar index, else ``np.take``),
GatherElements, GatherND, Compress, NonZero in this module; the scatters (Scatter,
ScatterElements, ScatterND, TensorScatter) in ``scatter``; OneHot, Unique,
ReverseSequence and Trilu in ``misc``.

Negative indices count from the end of their axis everywhere, as ONNX says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import const_ints, input_rank, to_ints
from ..registry import KernelRegistry

__all__ = ["along_axis_index", "register_kernels", "slice_key"]


# -- Slice ----------------------------------------------------------------------------------


def along_axis_index(idx: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """The fancy index selecting ``a[i0, ..., idx[i0..], ..., in]`` for every position of
    ``idx`` (GatherElements / ScatterElements). Unlike ``np.take_along_axis``, ``idx`` may be
    smaller than the data on the non-axis dims, as ONNX allows."""
    nd = idx.ndim
    key: list[np.ndarray] = []
    for d, n in enumerate(idx.shape):
        if d == axis:
            key.append(idx)
        else:
            shp = [1] * nd
            shp[d] = n
            key.append(np.arange(n).reshape(shp))
    return tuple(key)


def slice_key(
    shape: tuple[int, ...],
    starts: tuple[int, ...],
    ends: tuple[int, ...],
    axes: tuple[int, ...] | None,
    steps: tuple[int, ...] | None,
) -> tuple[slice, ...]:
    """The index tuple of ONNX Slice for an input of ``shape``.

    Python slicing clamps exactly as ONNX does, except a start below ``-dim`` with a
    negative step, which ONNX clamps to 0 (Python would make the slice empty)."""
    nd = len(shape)
    key = [slice(None)] * nd
    for i, (s, e) in enumerate(zip(starts, ends)):
        a = i if axes is None else axes[i]
        if a < 0:
            a += nd
        st = 1 if steps is None else steps[i]
        if st == 0:
            raise ValueError("Slice: step 0")
        if st < 0 and s < -shape[a]:
            s = 0
        key[a] = slice(s, e, st)
    return tuple(key)


def _static_slice_key(
    starts: tuple[int, ...],
    ends: tuple[int, ...],
    axes: tuple[int, ...] | None,
    steps: tuple[int, ...] | None,
    rank: int | None,
) -> tuple[Any, ...] | None:
    """A shape-independent key for constant slice parameters, or None when one needs the
    input's dims (negative axes of unknown rank, negative start with negative step)."""
    n = len(starts)
    ax = tuple(range(n)) if axes is None else axes
    st = (1,) * n if steps is None else steps
    if len(ends) != n or len(ax) != n or len(st) != n or 0 in st:
        return None
    if any(s < 0 and k < 0 for s, k in zip(starts, st)):
        return None
    if rank is not None:
        ax = tuple(a + rank if a < 0 else a for a in ax)
    if all(a >= 0 for a in ax):
        key: list[Any] = [slice(None)] * (max(ax) + 1 if ax else 0)
        for a, s, e, k in zip(ax, starts, ends, st):
            key[a] = slice(s, e, k)
        return tuple(key)
    if all(a < 0 for a in ax):
        tail: list[Any] = [slice(None)] * -min(ax)
        for a, s, e, k in zip(ax, starts, ends, st):
            tail[a] = slice(s, e, k)
        return (Ellipsis, *tail)
    return None


def _slice(ctx: KernelContext) -> ComputeFn:
    """Slice(data[, starts, ends, axes, steps]) -> strided view of data.

    Before opset 10 starts/ends/axes are attributes (steps 1); from 10 they are inputs.
    Ends beyond the dim (INT_MAX) clamp; negative values count from the end; negative steps
    walk backwards. Constant parameters give a precomputed index tuple."""
    rank = input_rank(ctx)
    if ctx.opset < 10:
        starts: tuple[int, ...] | None = to_ints(ctx.attr("starts"))
        ends: tuple[int, ...] | None = to_ints(ctx.attr("ends"))
        a = ctx.attr("axes", None)
        axes = None if a is None else to_ints(a)
        steps: tuple[int, ...] | None = None
        dyn_axes = dyn_steps = False
    else:
        starts, ends = const_ints(ctx, 1), const_ints(ctx, 2)
        axes, steps = const_ints(ctx, 3), const_ints(ctx, 4)
        dyn_axes = ctx.has_input(3) and axes is None
        dyn_steps = ctx.has_input(4) and steps is None
    if starts is not None and ends is not None and not dyn_axes and not dyn_steps:
        key = _static_slice_key(starts, ends, axes, steps, rank)
        if key is not None:

            def slice_static(x: np.ndarray, *_: Any) -> np.ndarray:
                return x[key]

            return slice_static
        c_starts, c_ends = starts, ends

        def slice_shape(x: np.ndarray, *_: Any) -> np.ndarray:
            return x[slice_key(x.shape, c_starts, c_ends, axes, steps)]

        return slice_shape

    def slice_dyn(
        x: np.ndarray,
        starts_in: np.ndarray,
        ends_in: np.ndarray,
        axes_in: np.ndarray | None = None,
        steps_in: np.ndarray | None = None,
    ) -> np.ndarray:
        return x[
            slice_key(
                x.shape,
                starts if starts is not None else to_ints(starts_in),
                ends if ends is not None else to_ints(ends_in),
                axes if not dyn_axes else (None if axes_in is None else to_ints(axes_in)),
                steps if not dyn_steps else (None if steps_in is None else to_ints(steps_in)),
            )
        ]

    return slice_dyn


# -- Gather family --------------------------------------------------------------------------


def _gather(ctx: KernelContext) -> ComputeFn:
    """Gather(data, indices) -> data's entries along ``axis`` at ``indices`` (output shape
    data.shape[:axis] + indices.shape + data.shape[axis+1:]). A constant scalar index gives
    a view."""
    axis = int(ctx.attr("axis", 0))
    idx = ctx.const_input(1)
    if idx is not None and idx.ndim == 0:
        i = int(idx)
        key: tuple[Any, ...] = (
            (*(slice(None),) * axis, i, Ellipsis)
            if axis >= 0
            else (Ellipsis, i, *(slice(None),) * (-axis - 1))
        )

        def gather_scalar(x: np.ndarray, *_: Any) -> np.ndarray:
            return x[key]

        return gather_scalar

    def gather(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        return np.take(x, indices, axis=axis)

    return gather


def _gather_elements(ctx: KernelContext) -> ComputeFn:
    """GatherElements(data, indices) -> out[..i..] = data[... indices[..i..] at axis ...];
    output has indices' shape."""
    axis = int(ctx.attr("axis", 0))

    def gather_elements(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        a = axis + x.ndim if axis < 0 else axis
        return x[along_axis_index(indices, a)]

    return gather_elements


def _gather_nd(ctx: KernelContext) -> ComputeFn:
    """GatherND(data, indices) -> slices of data addressed by the last axis of indices (k
    coordinates each), after ``batch_dims`` leading batch dims shared by both (opset 12+).
    Output shape: indices.shape[:-1] + data.shape[batch_dims + k:]."""
    b = int(ctx.attr("batch_dims", 0)) if ctx.opset >= 12 else 0

    def gather_nd(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        k = indices.shape[-1]
        if b == 0:
            if k == 0:
                return np.broadcast_to(x, indices.shape[:-1] + x.shape).copy()
            if k == 1:
                return np.take(x, indices[..., 0], axis=0)
            return x[tuple(np.moveaxis(indices, -1, 0))]
        bshape = x.shape[:b]
        nb = int(np.prod(bshape))
        xr = x.reshape((nb, *x.shape[b:]))
        ir = indices.reshape((nb, *indices.shape[b:]))
        ar = np.arange(nb).reshape((nb,) + (1,) * (ir.ndim - 2))
        res = xr[(ar, *np.moveaxis(ir, -1, 0))]
        return res.reshape(bshape + indices.shape[b:-1] + x.shape[b + k :])

    return gather_nd


def _compress(ctx: KernelContext) -> ComputeFn:
    """Compress(data, condition) -> the slices along ``axis`` (flattened data when none)
    where the bool condition is True; a shorter condition leaves the rest out."""
    a = ctx.attr("axis", None)
    axis = None if a is None else int(a)

    def compress(x: np.ndarray, condition: np.ndarray) -> np.ndarray:
        return np.compress(condition.reshape(-1), x, axis=axis)

    return compress


def _nonzero(ctx: KernelContext) -> ComputeFn:
    """NonZero(x) -> int64 (rank, n) indices of the non-zero elements, row-major order (a
    scalar counts as rank 1)."""

    def nonzero(x: np.ndarray) -> np.ndarray:
        if x.ndim == 0:
            x = x.reshape(1)
        return np.array(np.nonzero(x), dtype=np.int64)

    return nonzero


def register_kernels(registry: KernelRegistry) -> None:
    """Register Slice, Gather, GatherElements, GatherND, Compress, NonZero."""
    registry.add("Slice", _slice, since=1)
    registry.add("Gather", _gather, since=1)
    registry.add("GatherElements", _gather_elements, since=11)
    registry.add("GatherND", _gather_nd, since=11)
    registry.add("Compress", _compress, since=9)
    registry.add("NonZero", _nonzero, since=9)
