"""Kernels (contrib): three more of onnxruntime's QOperator ops -- QLinearSoftmax,
QLinearAveragePool and QLinearWhere -- computed as onnxruntime's CPU provider computes them.

- **QLinearSoftmax** (X, X_scale, x_zero_point?, y_scale, y_zero_point; ``axis``,
  ``opset``): onnxruntime's lookup table, ``t[j] = exp((j - 255) * X_scale + shift)`` in
  float32 (``shift = log(FLT_MAX / D) - 5`` keeps a row's sum finite), read at ``x -
  max(row) + 255``; the row sum in float32, element by element; ``y = rint(t / sum *
  floor(1 / y_scale)) + y_zero_point``, saturated. The zero point of X cancels. ``opset`` <
  13 coerces X to (N, D) at ``axis``; 13 and later reduce ``axis`` alone. onnxruntime's
  float steps are not all documented and its MLAS kernels differ by CPU (AVX2 / AVX-512:
  lane sums, the zero point added before rounding): these steps matched its output in
  every one of 11.9 million random elements on an AVX-512 host, but a value within ~1e-7
  of a half step may come out one unit apart elsewhere.
- **QLinearAveragePool** (X, x_scale, x_zero_point?, y_scale, y_zero_point?;
  ``kernel_shape``, ``strides``, ``pads``, ``auto_pad``, ``ceil_mode``,
  ``count_include_pad``, ``channels_last``): 1-D to 3-D, NCHW or channels-last. X
  dequantized in float32, each window summed in onnxruntime's order (kernel rows, then
  columns), divided by the window's in-image size (or the whole kernel with
  ``count_include_pad``; a ceil-mode window past the pads still counts the whole kernel,
  as onnxruntime does), then ``rint(y / y_scale + y_zero_point)``, saturated. A kernel
  that covers the image without pads takes QLinearGlobalAveragePool's integer path, as
  onnxruntime does.
- **QLinearWhere** (condition, X, x_scale, x_zp, Y, y_scale, y_zp, z_scale, z_zp):
  ``where(condition, X', Y')`` with X and Y requantized to Z's scale and zero point
  through 256-entry tables (onnxruntime's; the codes as they are where the scales and zero
  points equal Z's), broadcast.

A constant scale that is not a positive finite number, a scale or zero point of more than
one value, or zero points and quantized inputs of different 8-bit types are load errors
naming the node; the same at run time are errors of the call.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import ShapeMemo, attr_str, to_ints
from ..registry import KernelRegistry
from .activation import MS_DOMAIN
from .quantized import (
    _check_scalars,
    _global_average_pool,
    _quantize,
    _saturate,
    _scalar,
    _zp,
    dequantize,
)
from .quantized_elementwise import compiled_lookup

__all__ = ["TABLES_KEPT", "register_kernels"]

_F32 = np.float32
#: QLinearSoftmax keeps the exp tables of this many row lengths (a request's shape picks
#: the length: past it, a table is made per call and not kept)
TABLES_KEPT = 64
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _check_types(ctx: KernelContext, idx: tuple[int, ...]) -> None:
    """Load-time: the quantized inputs and zero points at ``idx`` whose types are known
    are all uint8 or all int8."""
    seen: dict[int, np.dtype] = {}
    for i in idx:
        c = ctx.const_input(i)
        dt = np.asarray(c).dtype if c is not None else ctx.input_dtype(i)
        if dt is None:
            continue
        if np.dtype(dt) not in _EIGHT_BIT:
            raise ctx.unsupported(f"input {i} is {np.dtype(dt)}, not uint8 or int8")
        seen[i] = np.dtype(dt)
    if len(set(seen.values())) > 1:
        kinds = ", ".join(f"input {i} {dt}" for i, dt in seen.items())
        raise ctx.unsupported(f"quantized inputs and zero points differ in type: {kinds}")


def _same_type(x: np.ndarray, *zps: Any) -> np.dtype:
    """``x``'s type (uint8 or int8), which every given zero point must share."""
    if x.dtype not in _EIGHT_BIT:
        raise TypeError(f"quantized tensors are uint8 or int8, not {x.dtype}")
    for z in zps:
        if z is not None and np.asarray(z).dtype != x.dtype:
            raise TypeError(f"a zero point is {np.asarray(z).dtype}, the input {x.dtype}")
    return x.dtype


# -- QLinearSoftmax ------------------------------------------------------------------------


def _exp_table(x_scale: float, d: int) -> np.ndarray:
    """onnxruntime's table for rows of ``d``: ``exp((j - 255 + shift / s) * s)``, float32."""
    s = float(_F32(x_scale))
    shift = math.log(float(_F32(np.finfo(_F32).max) / _F32(d)))
    shift = max(0.0, shift - 5.0) / s
    return np.exp((np.arange(256, dtype=np.float64) - 255.0 + shift) * s).astype(_F32)


def _softmax(ctx: KernelContext) -> ComputeFn:
    _check_scalars(ctx, (1, 2, 3, 4), (1, 3))
    _check_types(ctx, (0, 2, 4))
    opset = int(ctx.attr("opset"))
    axis = int(ctx.attr("axis", -1))
    xs_const = ctx.const_input(1)
    tables: dict[int, np.ndarray] = {}  # by row length, for a constant X_scale; bounded

    def qlinear_softmax(x: np.ndarray, x_scale: Any, x_zp: Any, y_scale: Any,
                        y_zp: Any = None) -> np.ndarray:  # fmt: skip
        dt = _same_type(x, x_zp, y_zp)
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"QLinearSoftmax: axis {axis} is out of range for rank {x.ndim}")
        if x.size == 0:
            return np.empty(x.shape, dt)
        ax = axis % x.ndim
        rows = x.reshape(math.prod(x.shape[:ax]), -1) if opset < 13 else np.moveaxis(x, ax, -1)
        d = rows.shape[-1]
        table = tables.get(d) if xs_const is not None else None
        if table is None:
            table = _exp_table(_scalar(x_scale, "X_scale"), d)
            if xs_const is not None and len(tables) < TABLES_KEPT:
                tables[d] = table
        codes = rows.astype(np.intp)
        codes -= codes.max(axis=-1, keepdims=True)
        codes += 255
        t = table[codes]
        total = np.cumsum(t, axis=-1, dtype=_F32)[..., -1:]  # in order, as onnxruntime
        t /= total
        t *= _F32(math.floor(_F32(1.0) / _F32(_scalar(y_scale, "y_scale"))))
        np.rint(t, out=t)
        t += _F32(_zp(y_zp, "y_zero_point"))
        y = _saturate(t, dt)
        return y.reshape(x.shape) if opset < 13 else np.moveaxis(y, -1, ax)

    return qlinear_softmax


# -- QLinearAveragePool --------------------------------------------------------------------


class _PoolPlan(NamedTuple):
    padded: tuple[int, ...]
    interior: tuple[slice, ...]
    taps: list[tuple[slice, ...]]  # per kernel position (row-major), into the padded input
    count: Any  # the divisor: a float, or float32 per output position
    whole: bool  # the kernel covers the image, no pads: the global pool's path


def _tdiv(a: int, b: int) -> int:
    """C's integer division (toward zero)."""
    return -(-a // b) if a < 0 else a // b


def _pool_plan(shape: tuple[int, ...], last: bool, kernel: tuple[int, ...],
               strides: tuple[int, ...], pads: tuple[int, ...], auto_pad: str, ceil: bool,
               include_pad: bool) -> _PoolPlan:  # fmt: skip
    """onnxruntime's pool geometry (PoolAttributes) for input ``shape``."""
    r = len(kernel)
    if len(shape) != r + 2:
        raise ValueError(f"QLinearAveragePool: input of rank {len(shape)} for a {r}-D kernel")
    sp = shape[1:-1] if last else shape[2:]
    outs, counts = [], []
    padded, interior, starts = list(shape), [slice(None)] * len(shape), []
    zero_pads = True
    for i, (n, k, s) in enumerate(zip(sp, kernel, strides)):
        pb, pe = pads[i], pads[i + r]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            need = (-(-n // s) - 1) * s + k - n
            pb = _tdiv(need, 2) if auto_pad == "SAME_UPPER" else _tdiv(need + 1, 2)
            pe = need - pb
        elif auto_pad == "VALID":
            pb = pe = 0
        zero_pads = zero_pads and pb == 0 and pe == 0
        span = (n + pb + pe - k) / s + 1
        o = math.ceil(span) if ceil else int(span)
        if ceil and (o - 1) * s >= n + pb:  # the last window starts in the image
            o -= 1
        if o < 1:
            raise ValueError(f"QLinearAveragePool: input {shape} is smaller than the kernel")
        left = max(0, pb)
        right = max(0, (o - 1) * s + k - pb - n)
        a = i + (1 if last else 2)
        padded[a] = left + n + right
        interior[a] = slice(left, left + n)
        starts.append(left - pb)
        lo = np.arange(o) * s - pb
        counts.append(np.minimum(lo + k, n) - np.maximum(lo, 0))
        outs.append(o)
    taps = []
    for pos in np.ndindex(*kernel):
        sl = [slice(None)] * len(shape)
        for i, (p, o, s) in enumerate(zip(pos, outs, strides)):
            b = starts[i] + p
            sl[i + (1 if last else 2)] = slice(b, b + (o - 1) * s + 1, s)
        taps.append(tuple(sl))
    count: Any = float(math.prod(kernel))
    if not include_pad:
        c = np.ones((), np.int64)
        for cnt in counts:
            c = np.multiply.outer(c, np.maximum(cnt, 1))
        count = (c[..., None] if last else c).astype(_F32)
    whole = zero_pads and tuple(sp) == kernel
    return _PoolPlan(tuple(padded), tuple(interior), taps, count, whole)


def _average_pool(ctx: KernelContext) -> ComputeFn:
    _check_scalars(ctx, (1, 2, 3, 4), (1, 3))
    _check_types(ctx, (0, 2, 4))
    kernel = to_ints(ctx.attr("kernel_shape"))
    r = len(kernel)
    strides = to_ints(ctx.attr("strides", (1,) * r))
    pads = to_ints(ctx.attr("pads", (0,) * (2 * r)))
    auto_pad = attr_str(ctx, "auto_pad", "NOTSET")
    ceil = bool(int(ctx.attr("ceil_mode", 0)))
    include_pad = bool(int(ctx.attr("count_include_pad", 0)))
    last = bool(int(ctx.attr("channels_last", 0)))
    if r not in (1, 2, 3) or len(strides) != r or len(pads) != 2 * r:
        raise ctx.unsupported(f"kernel_shape {kernel}, strides {strides}, pads {pads}: 1-D "
                              "to 3-D kernels with a stride per axis and two pads")  # fmt: skip
    if min(kernel) < 1 or min(strides) < 1 or min(pads) < 0:
        raise ctx.unsupported(f"kernel {kernel}, strides {strides} or pads {pads} below 1 (0)")
    if any(p >= kernel[i % r] for i, p in enumerate(pads)):
        raise ctx.unsupported(f"pads {pads} must be smaller than the kernel {kernel}")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad={auto_pad!r}")
    whole_image = _global_average_pool(ctx)
    plans: ShapeMemo[tuple[int, ...], _PoolPlan] = ShapeMemo()

    def qlinear_average_pool(x: np.ndarray, x_scale: Any, x_zp: Any, y_scale: Any,
                             y_zp: Any = None) -> np.ndarray:  # fmt: skip
        dt = _same_type(x, x_zp, y_zp)
        plan = plans.get(x.shape)
        if plan is None:
            plan = plans.put(x.shape, _pool_plan(x.shape, last, kernel, strides, pads, auto_pad,
                                                 ceil, include_pad))  # fmt: skip
        if plan.whole:
            return whole_image(x, x_scale, x_zp, y_scale, y_zp)
        xp = np.zeros(plan.padded, _F32)
        inner = xp[plan.interior]
        inner[...] = x
        inner -= _F32(_zp(x_zp, "x_zero_point"))
        inner *= _F32(_scalar(x_scale, "x_scale"))
        acc = xp[plan.taps[0]].copy()
        for tap in plan.taps[1:]:
            acc += xp[tap]
        acc /= plan.count
        acc /= _F32(_scalar(y_scale, "y_scale"))
        acc += _F32(_zp(y_zp, "y_zero_point"))
        np.rint(acc, out=acc)
        return _saturate(acc, dt)

    return qlinear_average_pool


# -- QLinearWhere --------------------------------------------------------------------------


def _where(ctx: KernelContext) -> ComputeFn:
    _check_scalars(ctx, (2, 3, 5, 6, 7, 8), (2, 5, 7))
    _check_types(ctx, (1, 3, 4, 6, 8))

    def make_table(dt: np.dtype, s: Any, z: Any, zs: Any, zz: Any) -> np.ndarray | None:
        """``s, z`` to ``zs, zz`` over the 256 codes; None where they are equal."""
        s, zs = _scalar(s, "scale"), _scalar(zs, "z_scale")
        z, zz = _zp(z, "zero point"), _zp(zz, "z_zero_point")
        if _F32(s) == _F32(zs) and z == zz:
            return None
        codes = np.arange(256, dtype=np.int64).astype(np.uint8).view(dt)
        return _quantize(dequantize(codes, s, z, "QLinearWhere"), zs, zz, dt)

    consts = [ctx.const_input(i) for i in (2, 3, 5, 6, 7, 8)]
    fixed: tuple[np.dtype, Any, Any] | None = None
    if all(c is not None for c in consts) and np.asarray(consts[5]).dtype in _EIGHT_BIT:
        xs, xz, ys, yz, zs, zz = consts
        dt0 = np.asarray(zz).dtype
        fixed = (dt0, make_table(dt0, xs, xz, zs, zz), make_table(dt0, ys, yz, zs, zz))

    def requantized(v: np.ndarray, table: np.ndarray | None) -> np.ndarray:
        if table is None:
            return v
        y = compiled_lookup(v, table)
        return y if y is not None else table[v.view(np.uint8)]

    def qlinear_where(cond: np.ndarray, x: np.ndarray, x_scale: Any, x_zp: Any, y: np.ndarray,
                      y_scale: Any, y_zp: Any, z_scale: Any, z_zp: Any) -> np.ndarray:  # fmt: skip
        dt = _same_type(x, x_zp, y_zp, z_zp)
        _same_type(y, z_zp)
        if fixed is not None and fixed[0] == dt:
            tx, ty = fixed[1], fixed[2]
        else:
            tx = make_table(dt, x_scale, x_zp, z_scale, z_zp)
            ty = make_table(dt, y_scale, y_zp, z_scale, z_zp)
        c = np.asarray(cond).astype(bool, copy=False)
        return np.where(c, requantized(x, tx), requantized(y, ty))

    return qlinear_where


def register_kernels(registry: KernelRegistry) -> None:
    """Register QLinearSoftmax, QLinearAveragePool and QLinearWhere."""
    registry.add("QLinearSoftmax", _softmax, domain=MS_DOMAIN, since=1)
    registry.add("QLinearAveragePool", _average_pool, domain=MS_DOMAIN, since=1)
    registry.add("QLinearWhere", _where, domain=MS_DOMAIN, since=1)
