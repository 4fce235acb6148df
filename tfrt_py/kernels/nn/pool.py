"""Kernels (nn): pooling -- MaxPool, AveragePool, LpPool, Global*Pool, MaxUnpool.

2-D MaxPool on float32/float64 runs ``pool_direct``'s compiled kernel when numba is there
(separable: the max over a window's rows, then over its columns). Otherwise windowed pools
pad the input once (when needed) and then either fold one strided slice
per kernel position into the output (``np.maximum``/``np.add`` with ``out=``: fast when
the output is not tiny) or reduce a strided window view (when the output is a few pixels
and the kernel large, e.g. a final 7x7 average pool). Geometry (auto_pad, ceil_mode,
dilations), the slices, the average divisors and MaxPool's index bases are computed once
per input shape and memoised. float16 averages accumulate in float32.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..base import OUT, ComputeFn, KernelContext
from ..common import ShapeMemo, compute_dtype, ones_vector
from ..registry import KernelRegistry
from .conv_common import Spatial, conv_geometry, parse_spatial, scratch
from .pool_avg import plan_avg_pool, run_avg_pool
from .pool_direct import plan_max_pool, run_max_pool

__all__ = ["register_kernels"]


class _Plan(NamedTuple):
    pad: bool
    padded_shape: tuple[int, ...]
    interior: tuple[slice, ...]
    slices: list[tuple[slice, ...]]  # per kernel position, into the padded input
    reduce: bool  # reduce a window view instead of folding slices
    view_shape: tuple[int, ...]  # (N, C, *out, *kernel)
    view_steps: tuple[int, ...]  # element steps per view axis (times itemsize = strides)
    out_shape: tuple[int, ...]
    scale: Any  # AveragePool: 1/divisor (scalar or array); else None
    # MaxPool indices: flat input index = nc_base + out_base + k_base[argmax]
    nc_base: Any
    out_base: Any
    k_base: Any


def _plan(
    ctx: KernelContext,
    sp: Spatial,
    x_shape: tuple[int, ...],
    ceil_mode: bool,
    avg: int = -1,  # AveragePool: count_include_pad (0/1); -1 for other pools
    scale_dtype: Any = np.float32,
    indices: int = -1,  # MaxPool with Indices: storage_order (0/1); -1 without
) -> _Plan:
    """The plan of a windowed pool for one input shape; ValueError when the shape does not
    fit the node's attributes."""
    r = len(x_shape) - 2
    kernel, strides, dil, pads = sp.resolve()
    if r < 1 or len(kernel) != r or len(strides) != r or len(dil) != r or len(pads) != 2 * r:
        raise ValueError(
            f"{ctx.op_type} {ctx.node_name!r}: input {x_shape} does not match "
            f"kernel_shape {kernel}, strides {strides}, dilations {dil}, pads {pads}"
        )
    in_sp = x_shape[2:]
    begin, end, out_sp = conv_geometry(in_sp, kernel, strides, dil, pads, sp.auto_pad, ceil_mode)
    if any(b < 0 for b in begin + end):
        raise ValueError(f"{ctx.op_type} {ctx.node_name!r}: negative pads {pads}")
    need = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out_sp, strides, kernel, dil)]
    end_used = tuple(max(0, nd - n - b) for nd, n, b in zip(need, in_sp, begin))
    padded_sp = tuple(n + b + e for n, b, e in zip(in_sp, begin, end_used))
    pad = any(begin) or any(end_used)
    interior = (slice(None), slice(None), *(slice(b, b + n) for b, n in zip(begin, in_sp)))
    slices = [
        (
            slice(None),
            slice(None),
            *(
                slice(p * d, p * d + (o - 1) * s + 1, s)
                for p, d, o, s in zip(pos, dil, out_sp, strides)
            ),
        )
        for pos in np.ndindex(*kernel)
    ]
    steps = [1]
    for d in reversed((*x_shape[:2], *padded_sp)[1:]):
        steps.append(steps[-1] * d)
    steps.reverse()
    view_steps = (
        steps[0],
        steps[1],
        *(a * s for a, s in zip(steps[2:], strides)),
        *(a * d for a, d in zip(steps[2:], dil)),
    )
    scale = None
    if avg >= 0:
        scale = _average_scale(in_sp, kernel, strides, dil, begin, end, out_sp, avg, scale_dtype)
    nc_base = out_base = k_base = None
    if indices >= 0:
        nc_base, out_base, k_base = _index_bases(
            x_shape, kernel, strides, dil, begin, out_sp, indices
        )
    return _Plan(
        bool(pad),
        (*x_shape[:2], *padded_sp),
        interior,
        slices,
        int(np.prod(out_sp)) <= 4 and int(np.prod(kernel)) > 4,
        (*x_shape[:2], *out_sp, *kernel),
        view_steps,
        (*x_shape[:2], *out_sp),
        scale,
        nc_base,
        out_base,
        k_base,
    )


def _average_scale(
    in_sp: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dil: tuple[int, ...],
    begin: tuple[int, ...],
    end: tuple[int, ...],
    out_sp: tuple[int, ...],
    count_include_pad: int,
    scale_dtype: Any,
) -> Any:
    """AveragePool's 1/divisor per output position: a scalar when every window counts the
    whole kernel, else an array of ``out_sp`` in ``scale_dtype``."""
    counts = []
    for i in range(len(in_sp)):
        if count_include_pad:
            lo, hi = 0, begin[i] + in_sp[i] + end[i]
        else:
            lo, hi = begin[i], begin[i] + in_sp[i]
        win = np.arange(out_sp[i])[:, None] * strides[i] + np.arange(kernel[i]) * dil[i]
        counts.append(((win >= lo) & (win < hi)).sum(axis=1))
    div = np.ones((), np.float64)
    for cnt in counts:
        div = np.multiply.outer(div, cnt)
    ksize = int(np.prod(kernel))
    if np.all(div == ksize):
        return 1.0 / ksize
    return (1.0 / np.maximum(div, 1)).astype(scale_dtype)


def _index_bases(
    x_shape: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dil: tuple[int, ...],
    begin: tuple[int, ...],
    out_sp: tuple[int, ...],
    storage_order: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MaxPool's Indices as (nc_base, out_base, k_base): the flat input index of output
    ``o``'s window tap ``k`` in channel ``nc`` is ``nc_base + out_base[o] + k_base[k]``."""
    in_sp = x_shape[2:]
    r = len(in_sp)
    # element strides of the unpadded input's spatial dims in the index order
    st = [1] * r
    if storage_order == 0:
        for i in range(r - 2, -1, -1):
            st[i] = st[i + 1] * in_sp[i + 1]
    else:
        for i in range(1, r):
            st[i] = st[i - 1] * in_sp[i - 1]
    out_base = np.zeros((), np.int64)
    k_base = np.zeros((), np.int64)
    for i in range(r):
        ob = (np.arange(out_sp[i], dtype=np.int64) * strides[i] - begin[i]) * st[i]
        kb = np.arange(kernel[i], dtype=np.int64) * dil[i] * st[i]
        out_base = np.add.outer(out_base, ob)
        k_base = np.add.outer(k_base, kb)
    nsp = int(np.prod(in_sp))
    n, c = x_shape[:2]
    nc_base = (np.arange(n * c, dtype=np.int64) * nsp).reshape((n, c) + (1,) * r)
    return nc_base, out_base, k_base.reshape(-1)


def _window_view(xp: np.ndarray, plan: _Plan) -> np.ndarray:
    xp = np.ascontiguousarray(xp)
    isz = xp.itemsize
    return as_strided(xp, plan.view_shape, [s * isz for s in plan.view_steps], writeable=False)


def _padded(x: np.ndarray, plan: _Plan, fill: Any) -> np.ndarray:
    """``x`` padded with ``fill``, in the per-thread scratch buffer (read within the call)."""
    if not plan.pad:
        return x
    xp = scratch(0, plan.padded_shape, x.dtype)
    xp.fill(fill)
    xp[plan.interior] = x
    return xp


def _fold(xp: np.ndarray, plan: _Plan, ufunc: Any, out: Any = None) -> np.ndarray:
    """Combine the kernel positions' strided slices with ``ufunc`` into a new array."""
    sl = plan.slices
    if out is None:
        y = xp[sl[0]].copy()
    else:
        y = out
        y[...] = xp[sl[0]]
    for s in sl[1:]:
        ufunc(y, xp[s], out=y)
    return y


def _kr(r: int) -> tuple[int, ...]:
    return tuple(range(-r, 0))


def _max_pool(ctx: KernelContext) -> ComputeFn:
    """MaxPool(X) -> Y[, Indices]: windowed max with pads/auto_pad, strides, dilations,
    ceil_mode. Indices are flat indices into X (row-major, or column-major spatial dims
    when storage_order=1), padding never selected. Supports float and 8-bit integers."""
    sp = parse_spatial(ctx)
    if sp.kernel_shape is None:
        raise ctx.unsupported("kernel_shape is required")
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    storage_order = int(ctx.attr("storage_order", 0))
    want_idx = ctx.has_output(1)
    r = len(sp.kernel_shape)
    axes = _kr(r)
    plans: ShapeMemo[Any, _Plan] = ShapeMemo()
    idx_mode = storage_order if want_idx else -1

    def get_plan(x: np.ndarray) -> _Plan:
        plan = plans.get(x.shape)
        if plan is None:
            plan = plans.put(x.shape, _plan(ctx, sp, x.shape, ceil_mode, indices=idx_mode))
        return plan

    def fill_of(dt: np.dtype) -> Any:
        return -np.inf if dt.kind == "f" else np.iinfo(dt).min

    if not want_idx:
        direct: ShapeMemo[Any, Any] = ShapeMemo()

        def direct_plan(x: np.ndarray) -> Any:
            if x.ndim != 4 or r != 2:
                return None
            kernel, strides, dil, pads = sp.resolve()
            begin, _, out_sp = conv_geometry(
                x.shape[2:], kernel, strides, dil, pads, sp.auto_pad, ceil_mode
            )
            if min(begin) < 0 or min(out_sp) < 1 or out_sp[0] * out_sp[1] < 16:
                return None
            out_shape = (*x.shape[:2], *out_sp)
            return plan_max_pool(x.shape, kernel, out_shape, strides, begin, dil, x.dtype)

        def max_pool(x: np.ndarray, out: Any = None) -> np.ndarray:
            key = (x.shape, x.dtype)
            dp = direct.get(key, False)
            if dp is False:
                dp = direct.put(key, direct_plan(x))
            if dp is not None and x.flags.c_contiguous and (out is None or out.flags.c_contiguous):
                return run_max_pool(dp, x, out)
            plan = get_plan(x)
            xp = _padded(x, plan, fill_of(x.dtype)) if plan.pad else x
            if plan.reduce:
                return _window_view(xp, plan).max(axis=axes, out=out)
            return _fold(xp, plan, np.maximum, out)

        if ctx.n_outputs > 1:  # an Indices output slot that is not wanted

            def max_pool_no_idx(x: np.ndarray, out: Any = None) -> tuple[np.ndarray, None]:
                return max_pool(x, out), None

            return max_pool_no_idx
        return max_pool

    def max_pool_idx(x: np.ndarray, out: Any = None) -> tuple[np.ndarray, np.ndarray]:
        plan = get_plan(x)
        xp = _padded(x, plan, fill_of(x.dtype)) if plan.pad else x
        v = _window_view(xp, plan)
        flat = v.reshape(*plan.out_shape, -1)
        k = flat.argmax(axis=-1)
        y = np.take_along_axis(flat, k[..., None], axis=-1)[..., 0]
        idx = plan.nc_base + plan.out_base + plan.k_base[k]
        if out is not None:
            out[...] = y
            y = out
        return y, idx

    return max_pool_idx


def _average_pool(ctx: KernelContext) -> ComputeFn:
    """AveragePool(X) -> Y: windowed mean; count_include_pad decides whether explicit or
    auto pads count in the divisor (ceil_mode's extra positions never count)."""
    sp = parse_spatial(ctx)
    if sp.kernel_shape is None:
        raise ctx.unsupported("kernel_shape is required")
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    cip = int(ctx.attr("count_include_pad", 0))
    dt0 = ctx.input_dtype(0)
    sdt = compute_dtype(np.dtype(dt0 if dt0 is not None else np.float32))
    axes = _kr(len(sp.kernel_shape))
    plans: ShapeMemo[Any, _Plan] = ShapeMemo()

    compiled: ShapeMemo[Any, Any] = ShapeMemo()

    def compiled_plan(x: np.ndarray, plan: _Plan) -> Any:
        if x.ndim != 4 or len(sp.kernel_shape or ()) != 2:
            return None
        kernel, strides, dil, pads = sp.resolve()
        begin, _, out_sp = conv_geometry(
            x.shape[2:], kernel, strides, dil, pads, sp.auto_pad, ceil_mode
        )
        if min(out_sp) < 1:
            return None
        out_shape = (*x.shape[:2], *out_sp)
        return plan_avg_pool(x.shape, kernel, out_shape, strides, begin, dil, x.dtype, plan.scale)

    def get_plan(x: np.ndarray) -> _Plan:
        plan = plans.get(x.shape)
        if plan is None:
            plan = plans.put(x.shape, _plan(ctx, sp, x.shape, ceil_mode, avg=cip, scale_dtype=sdt))
        return plan

    def average_pool(x: np.ndarray, out: Any = None) -> np.ndarray:
        key = (x.shape, x.dtype)
        cp = compiled.get(key, False)
        if cp is False:
            cp = compiled.put(key, compiled_plan(x, get_plan(x)))
        if cp is not None and x.flags.c_contiguous and (out is None or out.flags.c_contiguous):
            return run_avg_pool(cp, x, out)
        plan = get_plan(x)
        dt = x.dtype
        cdt = compute_dtype(dt)
        xc = x if cdt == dt else x.astype(cdt)
        xp = _padded(xc, plan, 0) if plan.pad else xc
        direct = out is not None and cdt == dt
        if plan.reduce:
            y = _window_view(xp, plan).sum(axis=axes, out=out if direct else None)
        else:
            y = _fold(xp, plan, np.add, out if direct else None)
        y *= plan.scale
        if cdt != dt:
            y = y.astype(dt)
        if out is not None and not direct:
            out[...] = y
            return out
        return y

    return average_pool


def _p_attr(ctx: KernelContext) -> float:
    p = ctx.attr("p", 2)
    if ctx.opset < 2:
        return float(p)
    return float(int(p))


def _lp_pool(ctx: KernelContext) -> ComputeFn:
    """LpPool(X) -> Y = (sum over window of |x|^p)^(1/p); pads contribute zero."""
    sp = parse_spatial(ctx)
    if sp.kernel_shape is None:
        raise ctx.unsupported("kernel_shape is required")
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    p = _p_attr(ctx)
    if p <= 0:
        raise ctx.unsupported(f"p={p}")
    axes = _kr(len(sp.kernel_shape))
    plans: ShapeMemo[Any, _Plan] = ShapeMemo()

    def lp_pool(x: np.ndarray) -> np.ndarray:
        plan = plans.get(x.shape)
        if plan is None:
            plan = plans.put(x.shape, _plan(ctx, sp, x.shape, ceil_mode))
        dt = x.dtype
        xc = x.astype(compute_dtype(dt))
        xa = np.square(xc) if p == 2.0 else np.power(np.abs(xc), p)
        xp = _padded(xa, plan, 0) if plan.pad else xa
        y = _window_view(xp, plan).sum(axis=axes) if plan.reduce else _fold(xp, plan, np.add)
        y = np.sqrt(y) if p == 2.0 else np.power(y, 1.0 / p)
        return y.astype(dt, copy=False)

    return lp_pool


def _global_average_pool(ctx: KernelContext) -> ComputeFn:
    """GlobalAveragePool(X) -> mean over all spatial axes, kept as size-1 dims."""

    def global_average_pool(x: np.ndarray) -> np.ndarray:
        n, c = x.shape[:2]
        if x.dtype.char in "fd" and x.size and x.flags.c_contiguous:
            # row sums as one BLAS matrix-vector product: NumPy's per-row mean over many
            # short rows is several times slower (squeeze-excite blocks call this often)
            x2 = x.reshape(n * c, -1)
            y = np.dot(x2, ones_vector(x2.shape[1], x.dtype.char))
            y *= 1.0 / x2.shape[1]
            return y.reshape((n, c) + (1,) * (x.ndim - 2))
        y = x.reshape(n, c, -1).mean(axis=-1, dtype=compute_dtype(x.dtype))
        return y.astype(x.dtype, copy=False).reshape((n, c) + (1,) * (x.ndim - 2))

    return global_average_pool


def _global_max_pool(ctx: KernelContext) -> ComputeFn:
    """GlobalMaxPool(X) -> max over all spatial axes, kept as size-1 dims."""

    def global_max_pool(x: np.ndarray) -> np.ndarray:
        n, c = x.shape[:2]
        return x.reshape(n, c, -1).max(axis=-1).reshape((n, c) + (1,) * (x.ndim - 2))

    return global_max_pool


def _global_lp_pool(ctx: KernelContext) -> ComputeFn:
    """GlobalLpPool(X) -> (sum over spatial axes of |x|^p)^(1/p), kept as size-1 dims."""
    p = _p_attr(ctx)

    def global_lp_pool(x: np.ndarray) -> np.ndarray:
        n, c = x.shape[:2]
        xc = x.reshape(n, c, -1).astype(compute_dtype(x.dtype))
        if p == 2.0:
            y = np.sqrt(np.einsum("ncs,ncs->nc", xc, xc))
        else:
            y = np.power(np.power(np.abs(xc), p).sum(axis=-1), 1.0 / p)
        return y.astype(x.dtype, copy=False).reshape((n, c) + (1,) * (x.ndim - 2))

    return global_lp_pool


def _max_unpool(ctx: KernelContext) -> ComputeFn:
    """MaxUnpool(X, I, output_shape?) -> Y: zeros with X scattered to the flat indices I.

    I indexes the MaxPool input shape ``(in-1)*stride + kernel - pads``; an
    ``output_shape`` larger than that zero-extends at the end of each axis."""
    sp = parse_spatial(ctx)
    if sp.kernel_shape is None:
        raise ctx.unsupported("kernel_shape is required")
    kernel, strides, _, pads = sp.resolve()
    r = len(kernel)

    def max_unpool(x: np.ndarray, ind: np.ndarray, output_shape: Any = None) -> np.ndarray:
        inferred = (
            *x.shape[:2],
            *(
                (x.shape[i + 2] - 1) * strides[i] - pads[i] - pads[i + r] + kernel[i]
                for i in range(r)
            ),
        )
        y = np.zeros(int(np.prod(inferred)), x.dtype)
        y[ind.reshape(-1)] = x.reshape(-1)
        y = y.reshape(inferred)
        if output_shape is None:
            return y
        shape = tuple(int(d) for d in np.asarray(output_shape).reshape(-1))
        if shape == inferred:
            return y
        res = np.zeros(shape, x.dtype)
        sl = tuple(slice(0, min(a, b)) for a, b in zip(inferred, shape))
        res[sl] = y[sl]
        return res

    return max_unpool


def register_kernels(registry: KernelRegistry) -> None:
    """Register MaxPool, AveragePool, LpPool, the global pools and MaxUnpool."""
    registry.add("MaxPool", _max_pool, since=1, flags=OUT)
    registry.add("AveragePool", _average_pool, since=1, flags=OUT)
    registry.add("LpPool", _lp_pool, since=1)
    registry.add("GlobalAveragePool", _global_average_pool, since=1)
    registry.add("GlobalMaxPool", _global_max_pool, since=1)
    registry.add("GlobalLpPool", _global_lp_pool, since=1)
    registry.add("MaxUnpool", _max_unpool, since=9)
