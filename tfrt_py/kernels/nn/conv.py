"""Kernels (nn): Conv, ConvInteger, QLinearConv (ConvTranspose and Col2Im are in
``conv_transpose``, DeformConv in ``conv_deform``; the shared geometry in ``conv_common``).

Conv runs as im2col + one matmul per call: the (padded) input is viewed through a strided
window view (N, groups, C/groups, *kernel, *out) and copied once into the im2col matrix,
then multiplied by the weights reshaped to (groups, M/groups, C/groups*prod(kernel)), which
is done at load when the weights are constant. 1x1 stride-1 unpadded convs skip the copy.
With one group the product is split over tfrt_py's intra-op threads when it is big enough
(``gemm.matmul_cols_into``: column blocks of the im2col matrix), one image at a time.
The padded input and the im2col matrix live in per-thread scratch buffers (no page faults
on fresh 100 MB allocations each call); only the output is a new array, or ``out``.
Everything shape-dependent (pads for auto_pad, output size, view strides) is computed once
per input shape and memoised; float16 computes in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..base import OUT, ComputeFn, Cost, KernelContext
from ..common import ShapeMemo, compute_dtype
from ..lib.gemm import matmul_cols_into, matmul_cols_whole
from ..lib.jit import frozen
from ..lib.quant import check_constants, requantize
from ..registry import KernelRegistry
from . import conv_cols, conv_cols_grouped
from .conv_blocked_fn import blocked_conv_fn
from .conv_cols_raw import raw_cols_fn
from .conv_common import (
    ConvNode,
    Spatial,
    bias_vector,
    conv_geometry,
    depthwise_taps,
    parse_spatial,
    scratch,
)
from .conv_depthwise import depthwise_conv_fn
from .conv_depthwise_grid import raw_depthwise_fn
from .conv_direct import ACTIVATIONS, Epilogue, make_epilogue
from .conv_packed_raw import raw_packed_fn
from .conv_stem import stem_conv_fn

__all__ = [
    "Epilogue",
    "conv_cost",
    "conv_with_epilogue",
    "make_conv_core",
    "register_kernels",
]


class _Plan(NamedTuple):
    """Everything one input shape needs, computed once."""

    pad: bool  # the input must be copied into a zero-padded buffer
    direct: bool  # 1x1, stride 1, no pad: the input reshaped is the im2col matrix
    padded_shape: tuple[int, ...]
    interior: tuple[slice, ...]
    view_shape: tuple[int, ...]
    view_strides: tuple[int, ...]
    cols_shape: tuple[int, ...]
    w2_shape: tuple[int, ...]
    mm_shape: tuple[int, ...]  # the matmul result's shape (a view of the output)
    out_shape: tuple[int, ...]
    # "extended grid" mode (depthwise, stride 1): im2col rows are runs of the flattened
    # padded image, so the copy moves long contiguous runs; the result is computed on
    # an (O_1, P_2, ..., P_r) grid and cropped to (O_1, ..., O_r).
    ext: bool = False
    padded_size: int = 0  # elements of the padded input
    flat_len: int = 0  # padded_size plus the tail the last run reads past it
    ext_shape: tuple[int, ...] = ()
    crop: tuple[slice, ...] = ()
    # 2-D depthwise (one output channel per group): (kernel, strides, dilations) for
    # ``conv_common.depthwise_taps``, which needs no im2col matrix
    taps: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None


# core(x, w, out) -> result of shape out_shape in the compute dtype
ConvCore = Callable[[np.ndarray, Any, Any], np.ndarray]


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The byte strides of a C-contiguous array of ``shape``."""
    strides = [itemsize]
    for d in reversed(shape[1:]):
        strides.append(strides[-1] * d)
    return tuple(reversed(strides))


def _make_plan(
    ctx: KernelContext,
    sp: Spatial,
    group: int,
    itemsize: int,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
) -> _Plan:
    """The plan of one (input, weights) shape pair; ValueError when they do not fit the
    node's attributes."""
    node = f"{ctx.op_type} {ctx.node_name!r}"
    if len(x_shape) != len(w_shape) or len(x_shape) < 3:
        raise ValueError(f"{node}: input {x_shape}, W {w_shape}")
    n, c = x_shape[:2]
    m, cg = w_shape[:2]
    if c != cg * group or m % group:
        raise ValueError(f"{node}: input channels {c}, weights {w_shape}, group={group}")
    kernel, strides, dil, pads = sp.resolve(w_shape[2:])
    r = len(kernel)
    if len(strides) != r or len(dil) != r or len(pads) != 2 * r:
        raise ValueError(f"{node}: attributes do not match rank {r}")
    begin, end, out_sp = conv_geometry(x_shape[2:], kernel, strides, dil, pads, sp.auto_pad)
    if any(b < 0 or e < 0 for b, e in zip(begin, end)):
        raise ValueError(f"{node}: negative pads {pads}")
    padded_shape = (n, c, *(i + b + e for i, b, e in zip(x_shape[2:], begin, end)))
    interior = (slice(None), slice(None), *(slice(b, b + i) for b, i in zip(begin, x_shape[2:])))
    xp_strides = _contiguous_strides(padded_shape, itemsize)
    k_strides = tuple(a * d for a, d in zip(xp_strides[2:], dil))
    ksize = int(np.prod(kernel))
    cgk = cg * ksize
    mg = m // group
    o = int(np.prod(out_sp))
    if group == 1:
        cols_shape: tuple[int, ...] = (cgk, o) if n == 1 else (n, cgk, o)
        w2_shape: tuple[int, ...] = (m, cgk)
        mm_shape: tuple[int, ...] = (m, o) if n == 1 else (n, m, o)
    else:
        cols_shape = (n, group, cgk, o)
        w2_shape = (group, mg, cgk)
        mm_shape = (n, group, mg, o)
    if group > 1 and cg == 1 and mg == 1 and r == 2 and ksize > 1:
        return _Plan(
            bool(any(begin) or any(end)),
            False,
            padded_shape,
            interior,
            (),
            (),
            (),
            w2_shape,
            mm_shape,
            (n, m, *out_sp),
            taps=(tuple(kernel), tuple(strides), tuple(dil)),
        )
    if group > 1 and cg == 1 and all(s == 1 for s in strides) and ksize > 1:
        # "extended grid": a stride-1 depthwise conv's im2col rows are runs of the
        # flattened padded image, computed on an (O_1, P_2, ..., P_r) grid and cropped
        length = out_sp[0] * int(np.prod(padded_shape[3:]))
        tail = sum((k - 1) * ks // itemsize for k, ks in zip(kernel[1:], k_strides[1:]))
        padded_size = int(np.prod(padded_shape))
        return _Plan(
            True,
            False,
            padded_shape,
            interior,
            (n, group, cg, *kernel, length),
            (xp_strides[0], xp_strides[1] * cg, xp_strides[1], *k_strides, itemsize),
            (n, group, cgk, length),
            w2_shape,
            mm_shape,
            (n, m, *out_sp),
            True,
            padded_size,
            padded_size + tail,
            (n, m, out_sp[0], *padded_shape[3:]),
            (slice(None), slice(None), slice(None), *(slice(0, d) for d in out_sp[1:])),
        )
    pad = any(begin) or any(end)
    direct = not pad and all(k == 1 for k in kernel) and all(s == 1 for s in strides)
    out_strides = (a * s for a, s in zip(xp_strides[2:], strides))
    return _Plan(
        bool(pad),
        direct,
        padded_shape,
        interior,
        (n, group, cg, *kernel, *out_sp),
        (xp_strides[0], xp_strides[1] * cg, xp_strides[1], *k_strides, *out_strides),
        cols_shape,
        w2_shape,
        mm_shape,
        (n, m, *out_sp),
    )


def _const_weights(
    ctx: KernelContext,
    sp: Spatial,
    group: int,
    w_const: np.ndarray,
    cdt: np.dtype,
    plans: dict[Any, _Plan],
    static_input: bool = True,
) -> np.ndarray:
    """The constant weights checked against the node and reshaped for the matmul, in
    ``cdt``; the input's static shape, when it has one (and ``static_input``: the node's
    input is the NCHW operand), is planned into ``plans``."""
    if w_const.ndim < 3:
        raise ctx.unsupported(f"weights of rank {w_const.ndim}; expected >= 3")
    if w_const.shape[0] % group:
        raise ctx.unsupported(f"{w_const.shape[0]} output channels, group={group}")
    if sp.kernel_shape is not None and tuple(sp.kernel_shape) != w_const.shape[2:]:
        raise ctx.unsupported(f"kernel_shape {sp.kernel_shape} != weights {w_const.shape}")
    ksize = int(np.prod(w_const.shape[2:]))
    m, cg = w_const.shape[:2]
    shape2 = (m, cg * ksize) if group == 1 else (group, m // group, cg * ksize)
    w2 = np.ascontiguousarray(w_const.reshape(shape2), dtype=cdt)
    t = ctx.input_type(0) if static_input else None
    if t is not None and t.is_static and t.shape is not None and len(t.shape) >= 3:
        shp = tuple(int(d) for d in t.shape)  # type: ignore[arg-type]
        try:
            plans[shp] = _make_plan(ctx, sp, group, cdt.itemsize, shp, tuple(w_const.shape))
        except ValueError as e:
            raise ctx.unsupported(str(e)) from e
    return w2


#: A one-group conv's im2col columns on the NumPy path are made for a group of images at a
#: time, at most this many bytes (one image where an image's are more), each group's product
#: one ``np.matmul``: columns that stay in cache between the copy and the product. ResNet-18's
#: convs at batch 30, one thread, 2-core AVX-512 Xeon: 576 -> 419 ms against the whole
#: batch's columns at once (16 MB: 467, 8 MB: 427, one image: 416).
IM2COL_GROUP_BYTES = 4 << 20


def _im2col_groups(w2: np.ndarray, view: np.ndarray, plan: _Plan, res: np.ndarray) -> np.ndarray:
    """``res`` (N, M, *out) = the one-group conv of the images under ``view`` (N, C, *kernel,
    *out: the strided im2col view of the padded input) by ``w2`` (M, C*taps), in groups of
    images of ``IM2COL_GROUP_BYTES`` columns (scratch slot 1)."""
    n, ck, o = plan.cols_shape
    g = max(1, min(n, IM2COL_GROUP_BYTES // max(1, ck * o * w2.itemsize)))
    cols = scratch(1, (g, ck, o), w2.dtype)
    mm = res.reshape(plan.mm_shape)
    whole = matmul_cols_whole(w2.shape[0], ck, o)
    for i in range(0, n, g):
        j = min(n, i + g)
        part = cols[: j - i]
        np.copyto(part.reshape((j - i, *plan.view_shape[1:])), view[i:j])
        if whole:
            np.matmul(w2, part, out=mm[i:j])
        else:
            for q in range(j - i):
                matmul_cols_into(w2, part[q], mm[i + q])
    return res


def make_conv_core(
    ctx: KernelContext,
    sp: Spatial,
    group: int,
    w_const: np.ndarray | None,
    cdt: np.dtype,
    static_input: bool = True,
) -> ConvCore:
    """The math of a grouped N-D convolution, without bias, computing in ``cdt``.

    ``core(x, w, out)``: ``x`` (N, C, *in) of any numeric dtype (cast to ``cdt``), ``w``
    (M, C/group, *kernel) or ignored when ``w_const`` (already zero-point adjusted for the
    integer ops) is given, ``out`` an optional contiguous (N, M, *out) ``cdt`` buffer (one of
    another shape is ignored). Returns the (N, M, *out) result in ``cdt``.
    """
    if group < 1:
        raise ctx.unsupported(f"group={group}")
    itemsize = cdt.itemsize
    plans: ShapeMemo[Any, _Plan] = ShapeMemo()
    w2_const = None if w_const is None else _const_weights(ctx, sp, group, w_const, cdt, plans,
                                                           static_input)  # fmt: skip
    w_shape_const: tuple[int, ...] = () if w_const is None else tuple(w_const.shape)

    def core(x: np.ndarray, w: Any, out: Any) -> np.ndarray:
        if w2_const is not None:
            key: Any = x.shape
            plan = plans.get(key)
            if plan is None:
                plan = plans.put(key, _make_plan(ctx, sp, group, itemsize, x.shape, w_shape_const))
            w2 = w2_const
        else:
            key = (x.shape, w.shape)
            plan = plans.get(key)
            if plan is None:
                plan = plans.put(key, _make_plan(ctx, sp, group, itemsize, x.shape, w.shape))
            w2 = w.reshape(plan.w2_shape).astype(cdt, copy=False)
        if out is not None and out.shape != plan.out_shape:
            out = None  # the caller's buffer holds a residual's broadcast shape (``conv``)
        if x.dtype != cdt:
            x = x.astype(cdt)
        if plan.taps is not None:
            if plan.pad:
                xp = scratch(0, plan.padded_shape, cdt)
                xp.fill(0)
                xp[plan.interior] = x
            else:
                xp = x
            res = np.empty(plan.out_shape, cdt) if out is None else out
            return depthwise_taps(xp, w2.reshape(w2.shape[0], -1), res, *plan.taps)
        if plan.ext:
            buf = scratch(0, (plan.flat_len,), cdt)
            buf.fill(0)
            buf[: plan.padded_size].reshape(plan.padded_shape)[plan.interior] = x
            view = np.ndarray(plan.view_shape, cdt, buf, 0, plan.view_strides)
            cols = scratch(1, plan.cols_shape, cdt)
            np.copyto(cols.reshape(plan.view_shape), view)
            r = np.matmul(w2, cols).reshape(plan.ext_shape)[plan.crop]
            if out is not None:
                np.copyto(out, r)
                return out
            return np.ascontiguousarray(r)
        if plan.direct:
            cols = x.reshape(plan.cols_shape)
        else:
            if plan.pad:
                xp = scratch(0, plan.padded_shape, cdt)
                xp.fill(0)
                xp[plan.interior] = x
            else:
                xp = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            view = np.ndarray(plan.view_shape, cdt, xp, 0, plan.view_strides)
            if w2.ndim == 2 and len(plan.cols_shape) == 3:
                res = np.empty(plan.out_shape, cdt) if out is None else out
                return _im2col_groups(w2, view, plan, res)
            cols = scratch(1, plan.cols_shape, cdt)
            np.copyto(cols.reshape(plan.view_shape), view)
        if w2.ndim == 2:  # one group: per image, a product split over tfrt_py's threads
            res = np.empty(plan.out_shape, cdt) if out is None else out
            mm = res.reshape(plan.mm_shape)
            if cols.ndim == 2:
                matmul_cols_into(w2, cols, mm)
            elif matmul_cols_whole(w2.shape[0], cols.shape[1], cols.shape[2]):
                np.matmul(w2, cols, out=mm)  # every image in one call: one GIL hand-off
            else:
                for i in range(cols.shape[0]):
                    matmul_cols_into(w2, cols[i], mm[i])
            return res
        if out is not None:
            np.matmul(w2, cols, out=out.reshape(plan.mm_shape))
            return out
        return np.matmul(w2, cols).reshape(plan.out_shape)

    return core


def _conv(ctx: KernelContext) -> ComputeFn:
    """Conv(X, W, B?) -> Y: grouped N-D convolution with strides, dilations, pads/auto_pad.

    Supports float16/32/64 (float16 computes in float32) and ``out=``. The input dtype is
    taken from the constant weights or the input's static type; when neither is known the
    core for the dtype seen is built on first use."""
    return conv_with_epilogue(ctx, Epilogue())


def conv_with_epilogue(ctx: KernelContext, epi: Epilogue) -> ComputeFn:
    """A Conv kernel followed by ``epi``: ``fn(X, W, B=None, R=None, out=None)`` returns
    ``epi.act(conv(X, W) + B + R)`` (R, when ``epi.residual``, has the output's shape).

    The node's attributes are Conv's. Bias, residual and activation are one pass over the
    result (``conv_direct.apply_epilogue``); 2-D depthwise convs with constant weights
    run ``conv_direct``'s compiled kernel (epilogue included) when numba is there and the
    plane is large enough for it to win, else im2col + GEMM."""
    sp = parse_spatial(ctx)
    group = int(ctx.attr("group", 1))
    w_const = ctx.const_input(1)
    dt = w_const.dtype if w_const is not None else ctx.input_dtype(0)
    b_const = ctx.const_input(2)
    if b_const is not None and b_const.ndim != 1:
        raise ctx.unsupported(f"bias of shape {b_const.shape}; expected 1-D")
    if b_const is not None and w_const is not None and b_const.shape[0] != w_const.shape[0]:
        raise ctx.unsupported(f"bias of {b_const.shape[0]} values for {w_const.shape[0]} filters")
    if epi.act not in ACTIVATIONS:
        raise ctx.unsupported(f"epilogue activation {epi.act!r}")
    if dt is None:
        cores: dict[np.dtype, Callable[..., Any]] = {}

        def conv_any(
            x: np.ndarray, w: np.ndarray, b: Any = None, r: Any = None, out: Any = None
        ) -> Any:
            fn = cores.get(x.dtype)
            if fn is None:
                fn = cores[x.dtype] = _conv_fn(ctx, sp, group, None, None, np.dtype(x.dtype), epi)
            return fn(x, w, b, r, out)

        return conv_any
    return _conv_fn(ctx, sp, group, w_const, b_const, np.dtype(dt), epi)


def _conv_fn(
    ctx: KernelContext,
    sp: Spatial,
    group: int,
    w_const: np.ndarray | None,
    b_const: np.ndarray | None,
    dt: np.dtype,
    epi: Epilogue,
) -> Callable[..., Any]:
    cdt = compute_dtype(dt)
    core = make_conv_core(ctx, sp, group, w_const, cdt)
    b_c: np.ndarray | None = None
    if b_const is not None:
        # a read-only view, as the warmed kernels' bias (the array itself may be the
        # caller's: a graph built in Python holds the caller's arrays)
        b_c = frozen(np.ascontiguousarray(b_const, dtype=cdt).view())
    same = cdt == dt
    epilogue = make_epilogue(epi)
    filters = -1 if w_const is None else int(w_const.shape[0])
    node = ConvNode(sp, group, w_const, b_c, cdt, epi)
    blocked = blocked_conv_fn(node) if same else None
    if blocked is not None and cdt == np.float32:
        (conv_cols if group == 1 else conv_cols_grouped).compile_at_build()
    # the compiled paths, each None where it does not serve the node and returning None
    # for a call it declines; the ctypes ones serve a cold start's stand-ins once built
    paths = () if not same else tuple(p for p in (
        depthwise_conv_fn(node), raw_depthwise_fn(node), stem_conv_fn(node), blocked,
        raw_packed_fn(node), raw_cols_fn(node)) if p is not None)  # fmt: skip

    def conv(
        x: np.ndarray, w: np.ndarray, b: Any = None, r: Any = None, out: Any = None
    ) -> np.ndarray:
        if b is not None and (b_c is None or filters < 0):  # (load checked constants)
            _check_bias(ctx, b, filters if filters >= 0 else w.shape[0])  # read unchecked
        for path in paths:
            y = path(x, b, r, out)
            if y is not None:
                return y
        direct = same and out is not None and out.flags.c_contiguous
        direct = direct and (r is None or r.shape == out.shape)
        y = core(x, w, out if direct else None)
        bb = bias_vector(b, b_c, cdt)
        if r is not None and (r.shape != y.shape or r.dtype != y.dtype):
            # a residual whose dims the fusion could not compare (``fuse_conv``): broadcast
            grows = np.broadcast_shapes(y.shape, r.shape) != y.shape
            y = np.add(y, r, out=None if grows else y, casting="unsafe")
            r = None
        epilogue(y, bb, r)
        if not same:
            y = y.astype(dt)
        if out is not None and y is not out:
            out[...] = y
            y = out
        return y

    return conv


def _check_bias(ctx: KernelContext, b: Any, m: int) -> None:
    """A bias input (not a constant, which load checks) of one value for each of the ``m``
    filters: ValueError otherwise, as onnxruntime refuses it (the compiled paths read one a
    filter: a short one was read past its end)."""
    if np.ndim(b) != 1 or np.shape(b)[0] != m:
        raise ValueError(f"{ctx.op_type} {ctx.node_name!r}: bias of shape {np.shape(b)}; "
                         f"expected ({m},), one value a filter")  # fmt: skip


def conv_cost(ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> Cost:
    """The cost of a Conv (or a fused Conv) from its weight and output shapes."""
    if len(ins) < 2 or not outs:
        return Cost(0.0, 0.0)
    w, y = ins[1], outs[0]
    flops = 2.0 * float(np.prod(y)) * float(np.prod(w[1:]))
    return Cost(flops, 4.0 * (float(np.prod(ins[0])) + float(np.prod(w)) + float(np.prod(y))))


def qconv_cost(ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> Cost:
    """QLinearConv's cost (NCHW or channels-last: the same products): 8-bit operands."""
    if len(ins) < 4 or not outs:
        return Cost(0.0, 0.0)
    w, y = ins[3], outs[0]
    ops = 2.0 * float(np.prod(y)) * float(np.prod(w[1:]))
    return Cost(ops, float(np.prod(ins[0])) + float(np.prod(w)) + float(np.prod(y)))


def _int_compute_dtype(w_const: np.ndarray | None) -> np.dtype:
    """float32 is exact for 8-bit products summed over <= 2**24 // 255**2 = 258 terms."""
    if w_const is not None and w_const.ndim >= 2 and int(np.prod(w_const.shape[1:])) <= 258:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _zp_weights(w: np.ndarray, zp: Any, cdt: np.dtype) -> np.ndarray:
    """w - zero point (scalar or per output channel) in ``cdt``."""
    w = w.astype(cdt)
    if zp is None:
        return w
    zp = np.asarray(zp)
    if zp.ndim == 1 and zp.size == w.shape[0] and zp.size != 1:
        return w - zp.astype(cdt).reshape((-1,) + (1,) * (w.ndim - 1))
    return w - zp.astype(cdt).reshape(())


def _conv_integer(ctx: KernelContext) -> ComputeFn:
    """ConvInteger(X, W, x_zero_point?, w_zero_point?) -> int32 Y = (X-xzp) conv (W-wzp).

    Computes exactly in float32/float64 (by the reduction length) on BLAS."""
    sp = parse_spatial(ctx)
    group = int(ctx.attr("group", 1))
    w_raw = ctx.const_input(1)
    wzp_const = ctx.const_input(3)
    cdt = _int_compute_dtype(w_raw)
    w_const = None
    if w_raw is not None and (wzp_const is not None or not ctx.has_input(3)):
        w_const = _zp_weights(w_raw, wzp_const, cdt)
    core = make_conv_core(ctx, sp, group, w_const, cdt)

    def conv_integer(x: np.ndarray, w: np.ndarray, x_zp: Any = None, w_zp: Any = None) -> Any:
        xf = x.astype(cdt)
        if x_zp is not None:
            xf -= np.asarray(x_zp, dtype=cdt).reshape(())
        wf = w if w_const is not None else _zp_weights(w, w_zp, cdt)
        return core(xf, wf, None).astype(np.int32)

    return conv_integer


def _qlinear_conv_ms(ctx: KernelContext) -> ComputeFn:
    """com.microsoft QLinearConv: ONNX's, with ``channels_last=1`` taking x as (N, H, W, C)
    and giving y as (N, OH, OW, Co) (what the ``channels_last`` pass makes of integer
    convs); NCHW operands transposed around the ONNX kernel where the integer one cannot
    take x."""
    return _qlinear_conv(ctx, channels_last=bool(int(ctx.attr("channels_last", 0))))


def _qlinear_conv(ctx: KernelContext, channels_last: bool = False) -> ComputeFn:
    """QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B?) -> quantized y.

    y = saturate(round((x-xzp) conv (w-wzp) + B) * x_scale*w_scale/y_scale) + y_zp), with
    per-tensor or per-output-channel w_scale/w_zp; rounding half to even. ``channels_last``
    (com.microsoft's attribute): x (N, H, W, C) -> y (N, OH, OW, Co), on the integer kernel
    or else transposed around the NCHW path."""
    sp = parse_spatial(ctx)
    group = int(ctx.attr("group", 1))
    w_raw = ctx.const_input(3)
    co = 0 if w_raw is None or w_raw.ndim < 1 else int(w_raw.shape[0])
    check_constants(ctx, {1: 0, 4: co, 6: 0}, {2: 0, 5: co, 7: 0})
    wzp_const = ctx.const_input(5)
    cdt = _int_compute_dtype(w_raw)
    w_const = None
    if w_raw is not None and (wzp_const is not None or not ctx.has_input(5)):
        w_const = _zp_weights(w_raw, wzp_const, cdt)
    core = make_conv_core(ctx, sp, group, w_const, cdt, static_input=not channels_last)
    integer = _qconv_plan(ctx, sp, group, w_raw)

    def qlinear_conv(
        x: np.ndarray,
        x_scale: np.ndarray,
        x_zp: Any,
        w: np.ndarray,
        w_scale: np.ndarray,
        w_zp: Any,
        y_scale: np.ndarray,
        y_zp: Any = None,
        b: Any = None,
    ) -> np.ndarray:
        if integer is not None:
            y = integer.run(x)
            if y is not None:
                return y
        xf = x.astype(cdt)
        if x_zp is not None:
            xf -= np.asarray(x_zp, dtype=cdt).reshape(())
        wf = w if w_const is not None else _zp_weights(w, w_zp, cdt)
        acc = core(xf, wf, None)
        nsp = acc.ndim - 2
        if b is not None:
            acc += b.astype(cdt).reshape((-1,) + (1,) * nsp)
        ws = np.asarray(w_scale)
        if ws.ndim == 1 and ws.size > 1:
            ws = ws.reshape((-1,) + (1,) * nsp)
        scale = (np.asarray(x_scale) * ws / np.asarray(y_scale)).astype(np.float64)
        return requantize(acc, scale, y_zp, x.dtype)

    if not channels_last:
        return qlinear_conv

    def qlinear_conv_nhwc(x: np.ndarray, *rest: Any) -> np.ndarray:
        if x.ndim != 4:
            raise ValueError(f"channels_last QLinearConv takes a 4-D x, not rank {x.ndim}")
        if integer is not None:
            y = integer.run(x, channels_last=True)
            if y is not None:
                return y
        y = qlinear_conv(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), *rest)
        return np.ascontiguousarray(y.transpose(0, 2, 3, 1))

    return qlinear_conv_nhwc


def _qconv_plan(ctx: KernelContext, sp: Any, group: int, w: np.ndarray | None) -> Any:
    """``conv_qint8``'s plan when every operand but x is a constant and the conv is 2-D,
    ungrouped or depthwise, with explicit (or no) padding; else None (the exact float
    path)."""
    if w is None or w.ndim != 4 or sp.auto_pad not in ("NOTSET", "VALID"):
        return None
    depthwise = group > 1 and w.shape[1] == 1 and group == w.shape[0]
    if group != 1 and not depthwise:
        return None
    consts = [ctx.const_input(i) for i in (1, 2, 4, 5, 6, 7)]
    if any(v is None for v in consts) or (ctx.has_input(8) and ctx.const_input(8) is None):
        return None
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = consts
    kernel, strides, dilations, pads = sp.resolve(w.shape[2:])
    if sp.auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    if tuple(kernel) != tuple(w.shape[2:]):
        return None
    geo = (*kernel, *strides, *dilations, pads[0], pads[1], pads[2], pads[3])
    bias = ctx.const_input(8) if ctx.has_input(8) else None
    from .conv_qdepthwise import plan_depthwise
    from .conv_qint8 import plan

    make = plan_depthwise if depthwise else plan
    return make(w, w_scale, w_zp, x_scale, x_zp, y_scale, y_zp, bias, geo)


def register_kernels(registry: KernelRegistry) -> None:
    """Register Conv, ConvInteger and QLinearConv."""
    registry.add("Conv", _conv, since=1, flags=OUT, cost=conv_cost)
    registry.add("ConvInteger", _conv_integer, since=10)
    registry.add("QLinearConv", _qlinear_conv, since=10, cost=qconv_cost)
    registry.add("QLinearConv", _qlinear_conv_ms, domain="com.microsoft", since=1, cost=qconv_cost)
