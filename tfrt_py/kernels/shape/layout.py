"""Kernels (shape): ops that rearrange or describe a tensor without arithmetic.

Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Identity and BitCast return *views* of
their input (the contract allows it: the executor copies before handing a value that aliases
a feed or constant to the user); Split returns views too. Concat, Expand and Tile produce
new arrays and accept ``out=``. Shape and Size return fresh tiny int64 arrays.

Constant shape/axes inputs (a Reshape's shape, Squeeze/Unsqueeze axes, Split sizes, Tile
repeats, Expand shape) are read at load time; the compute functions then only do the math.
The rest of the family lives in ``gen`` (ConstantOfShape, Range, EyeLike, Dropout,
DepthToSpace, SpaceToDepth) and ``pad`` (Pad, CenterCropPad).
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from ...ir.dtypes import is_sub_byte
from ..base import OUT, ComputeFn, KernelContext
from ..common import const_ints, input_rank, to_ints
from ..registry import KernelRegistry

__all__ = ["register_kernels"]

# -- Reshape / Flatten / Transpose / Squeeze / Unsqueeze ------------------------------------


def _reshape(ctx: KernelContext) -> ComputeFn:
    """Reshape(data, shape) -> view when possible. ``0`` copies the input dim unless
    ``allowzero`` (opset 14+); ``-1`` is inferred. Before opset 5 the shape is an attribute.
    A constant shape is resolved at load."""
    allowzero = bool(ctx.attr("allowzero", 0)) if ctx.opset >= 14 else False
    if ctx.opset < 5:
        const: tuple[int, ...] | None = to_ints(ctx.attr("shape"))
    else:
        const = const_ints(ctx, 1)
    if const is None:

        def reshape_dyn(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
            s = shape.tolist()
            if not allowzero and 0 in s:
                xs = x.shape
                s = [xs[i] if v == 0 else v for i, v in enumerate(s)]
            return x.reshape(s)

        return reshape_dyn

    target = const
    if allowzero or 0 not in target:

        def reshape(x: np.ndarray, *_: Any) -> np.ndarray:
            return x.reshape(target)

        return reshape

    zeros = tuple(i for i, v in enumerate(target) if v == 0)

    def reshape_copy_dims(x: np.ndarray, *_: Any) -> np.ndarray:
        s = list(target)
        xs = x.shape
        for i in zeros:
            s[i] = xs[i]
        return x.reshape(s)

    return reshape_copy_dims


def _flatten(ctx: KernelContext) -> ComputeFn:
    """Flatten(x) -> 2-D view (outer dims before ``axis``, inner dims from it)."""
    axis = int(ctx.attr("axis", 1))

    def flatten(x: np.ndarray) -> np.ndarray:
        s = x.shape
        a = axis if axis >= 0 else axis + len(s)
        outer = prod(s[:a])
        return x.reshape(outer, -1) if outer else x.reshape(0, prod(s[a:]))

    return flatten


def _transpose(ctx: KernelContext) -> ComputeFn:
    """Transpose(x) -> strided view with axes permuted by ``perm`` (default: reversed)."""
    perm = ctx.attr("perm", None)
    if perm is None:

        def transpose_rev(x: np.ndarray) -> np.ndarray:
            return x.transpose()

        return transpose_rev
    p = to_ints(perm)

    def transpose(x: np.ndarray) -> np.ndarray:
        return x.transpose(p)

    return transpose


def _squeeze(ctx: KernelContext) -> ComputeFn:
    """Squeeze(x[, axes]) -> view without the listed size-1 dims (all size-1 dims when no
    axes). Axes are an attribute before opset 13, an optional input from 13."""
    if ctx.opset < 13:
        a = ctx.attr("axes", None)
        axes: tuple[int, ...] | None = None if a is None else to_ints(a)
        dynamic = False
    else:
        axes = const_ints(ctx, 1)
        dynamic = ctx.has_input(1) and axes is None
    if dynamic:

        def squeeze_dyn(x: np.ndarray, axes_in: np.ndarray | None = None) -> np.ndarray:
            if axes_in is None or axes_in.size == 0:
                return x.squeeze()
            return x.squeeze(to_ints(axes_in))

        return squeeze_dyn
    if not axes:

        def squeeze_all(x: np.ndarray, *_: Any) -> np.ndarray:
            return x.squeeze()

        return squeeze_all
    ax = axes

    def squeeze(x: np.ndarray, *_: Any) -> np.ndarray:
        return x.squeeze(ax)

    return squeeze


def _unsqueeze_positions(axes: tuple[int, ...], out_rank: int) -> tuple[int, ...]:
    pos = sorted(a + out_rank if a < 0 else a for a in axes)
    if len(set(pos)) != len(pos) or any(not 0 <= a < out_rank for a in pos):
        raise ValueError(f"Unsqueeze: invalid axes {axes} for output rank {out_rank}")
    return tuple(pos)


def _unsqueeze(ctx: KernelContext) -> ComputeFn:
    """Unsqueeze(x[, axes]) -> view with size-1 dims inserted at ``axes`` (output-rank
    positions). Axes are an attribute before opset 13, a required input from 13."""
    axes = to_ints(ctx.attr("axes")) if ctx.opset < 13 else const_ints(ctx, 1)
    if axes is None:

        def unsqueeze_dyn(x: np.ndarray, axes_in: np.ndarray) -> np.ndarray:
            s = list(x.shape)
            for a in _unsqueeze_positions(to_ints(axes_in), len(s) + axes_in.size):
                s.insert(a, 1)
            return x.reshape(s)

        return unsqueeze_dyn
    ax = axes
    rank = input_rank(ctx)
    if rank is not None or all(a >= 0 for a in ax):
        # Non-negative axes are output positions whatever the rank: insert them in order.
        pos = _unsqueeze_positions(ax, len(ax) + (rank if rank is not None else max(ax) + 1))

        last = pos[-1] if pos else -1
        n_new = len(pos)

        def unsqueeze(x: np.ndarray, *_: Any) -> np.ndarray:
            s = list(x.shape)
            if last >= len(s) + n_new:
                raise ValueError(f"Unsqueeze: axes {ax} out of range for rank {len(s)}")
            for a in pos:
                s.insert(a, 1)
            return x.reshape(s)

        return unsqueeze

    def unsqueeze_any_rank(x: np.ndarray, *_: Any) -> np.ndarray:
        s = list(x.shape)
        for a in _unsqueeze_positions(ax, len(s) + len(ax)):
            s.insert(a, 1)
        return x.reshape(s)

    return unsqueeze_any_rank


def _identity(ctx: KernelContext) -> ComputeFn:
    """Identity(x) -> x itself (tensors, sequences and optionals alike)."""

    def identity(x: Any) -> Any:
        return x

    return identity


def _bitcast(ctx: KernelContext) -> ComputeFn:
    """BitCast(x) -> view of the same bytes as dtype ``to`` (same bit width, same shape)."""
    to = ctx.elem_dtype(ctx.attr("to"), "to")
    if is_sub_byte(to):
        raise ctx.unsupported(f"BitCast to the sub-byte type {to.name}")
    src = ctx.input_dtype(0)
    if src is not None and src.itemsize != to.itemsize:
        raise ctx.unsupported(f"BitCast {src.name} -> {to.name}: bit widths differ")

    def bitcast(x: np.ndarray) -> np.ndarray:
        if x.dtype.itemsize != to.itemsize:
            raise ValueError(f"BitCast {x.dtype.name} -> {to.name}: bit widths differ")
        return x.view(to)

    return bitcast


# -- Shape / Size -----------------------------------------------------------------------------


def _shape(ctx: KernelContext) -> ComputeFn:
    """Shape(x) -> int64 1-D array of x's dims, sliced by ``start``/``end`` (opset 15+,
    clamped like Python slicing)."""
    start = int(ctx.attr("start", 0)) if ctx.opset >= 15 else 0
    end = ctx.attr("end", None) if ctx.opset >= 15 else None
    if start == 0 and end is None:

        def shape(x: np.ndarray) -> np.ndarray:
            return np.array(x.shape, dtype=np.int64)

        return shape
    sl = slice(start, None if end is None else int(end))

    def shape_slice(x: np.ndarray) -> np.ndarray:
        return np.array(x.shape[sl], dtype=np.int64)

    return shape_slice


def _size(ctx: KernelContext) -> ComputeFn:
    """Size(x) -> int64 scalar, the number of elements."""

    def size(x: np.ndarray) -> np.ndarray:
        return np.array(x.size, dtype=np.int64)

    return size


# -- Concat / Split -----------------------------------------------------------------------------


def _concat(ctx: KernelContext) -> ComputeFn:
    """Concat(*xs) -> one array joined along ``axis`` (default 1 before opset 4). An ``out``
    that shares memory with ``xs[0]`` is the caller's buffer that starts with that very
    feed (a KV cache grown in place: the one overlap ``feeds.check_output_buffers`` lets
    through, checked exactly before the call; the executors never plan one): only the rest
    is written."""
    axis = int(ctx.attr("axis", 1) if ctx.opset < 4 else ctx.attr("axis"))

    def concat(*xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None and len(xs) == 2 and np.may_share_memory(out, xs[0]):
            n = xs[0].shape[axis]
            out[_axis_key(axis, n, n + xs[1].shape[axis])] = xs[1]
            return out
        return np.concatenate(xs, axis=axis, out=out)

    return concat


def _axis_key(axis: int, start: int, stop: int) -> tuple[Any, ...]:
    """The index tuple selecting ``start:stop`` along ``axis`` (negative: from the end)."""
    if axis >= 0:
        return (*(slice(None),) * axis, slice(start, stop))
    return (Ellipsis, slice(start, stop), *(slice(None),) * (-axis - 1))


def _split(ctx: KernelContext) -> ComputeFn:
    """Split(x[, split]) -> tuple of views along ``axis`` (one output: the view itself, as
    every kernel of a one-output node returns its array, never a 1-tuple). Sizes come from
    the ``split`` attribute (before opset 13) or input (13+); otherwise equal parts of
    ceil(dim / n), the last one smaller (``num_outputs`` from opset 18, else the number of
    outputs)."""
    axis = int(ctx.attr("axis", 0))
    n = ctx.n_outputs
    if ctx.opset >= 18 and "num_outputs" in ctx.attrs:
        n = int(ctx.attr("num_outputs"))
        if n != ctx.n_outputs:
            raise ctx.unsupported(f"num_outputs={n} but the node has {ctx.n_outputs} outputs")
    sizes: tuple[int, ...] | None = None
    dynamic = False
    if (ctx.opset >= 13 or ctx.opset == 1) and ctx.has_input(1):
        sizes = const_ints(ctx, 1)
        dynamic = sizes is None
    if ctx.opset < 13 and "split" in ctx.attrs:
        sizes = to_ints(ctx.attr("split"))
    if sizes is not None:
        if len(sizes) != n:
            raise ctx.unsupported(f"{len(sizes)} split sizes for {n} outputs")
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        keys = tuple(_axis_key(axis, bounds[i], bounds[i + 1]) for i in range(n))

        if n == 1:  # one output: the kernel returns the array, not a 1-tuple
            key = keys[0]
            return lambda x, *_: x[key]

        def split(x: np.ndarray, *_: Any) -> tuple[np.ndarray, ...]:
            return tuple(x[k] for k in keys)

        return split

    def split_dyn(x: np.ndarray, split_in: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        if dynamic and split_in is not None:
            b = np.concatenate([[0], np.cumsum(split_in)]).tolist()
        else:
            dim = x.shape[axis]
            chunk = -(-dim // n)
            b = [min(i * chunk, dim) for i in range(n + 1)]
        return tuple(x[_axis_key(axis, b[i], b[i + 1])] for i in range(n))

    if n == 1:
        return lambda x, split_in=None: split_dyn(x, split_in)[0]
    return split_dyn


# -- Expand / Tile ------------------------------------------------------------------------------


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    out = tuple(y if x == 1 else x for x, y in zip(a, b))
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"Expand: shape {b} does not broadcast with input shape {a}")
    return out


def _expand(ctx: KernelContext) -> ComputeFn:
    """Expand(x, shape) -> new array: x broadcast bidirectionally with ``shape``. Returns x
    itself when the shape does not change."""
    const = const_ints(ctx, 1)

    def expand(x: np.ndarray, shape: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None:
            np.copyto(out, x)
            return out
        tgt = _broadcast_shape(x.shape, const if const is not None else to_ints(shape))
        if tgt == x.shape:
            return x
        res = np.empty(tgt, x.dtype)
        np.copyto(res, x)
        return res

    return expand


def _tile(ctx: KernelContext) -> ComputeFn:
    """Tile(x, repeats) -> new array, x repeated ``repeats[i]`` times along each dim."""
    const = const_ints(ctx, 1)

    def tile(x: np.ndarray, repeats: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        reps = const if const is not None else to_ints(repeats)
        shp = x.shape
        if len(reps) != len(shp):
            raise ValueError(f"Tile: {len(reps)} repeats for rank {len(shp)}")
        inter_out: list[int] = []
        inter_in: list[int] = []
        for d, k in zip(shp, reps):
            inter_out += (k, d)
            inter_in += (1, d)
        res = out
        if res is None or not res.flags.c_contiguous:
            res = np.empty(tuple(d * k for d, k in zip(shp, reps)), x.dtype)
        np.copyto(res.reshape(inter_out), x.reshape(inter_in))
        if out is not None and res is not out:
            np.copyto(out, res)
            return out
        return res

    return tile


def register_kernels(registry: KernelRegistry) -> None:
    """Register Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Identity, BitCast (views of
    their input), Shape, Size, Concat, Split, Expand and Tile."""
    registry.add("Reshape", _reshape, since=1)
    registry.add("Flatten", _flatten, since=1)
    registry.add("Transpose", _transpose, since=1)
    registry.add("Squeeze", _squeeze, since=1)
    registry.add("Unsqueeze", _unsqueeze, since=1)
    registry.add("Identity", _identity, since=1)
    registry.add("BitCast", _bitcast, since=26)
    registry.add("Shape", _shape, since=1)
    registry.add("Size", _size, since=1)
    registry.add("Concat", _concat, since=1, flags=OUT)
    registry.add("Split", _split, since=1)
    registry.add("Expand", _expand, since=8, flags=OUT)
    registry.add("Tile", _tile, since=6, flags=OUT)
