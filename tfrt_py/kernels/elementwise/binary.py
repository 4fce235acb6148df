"""Kernels (elementwise): binary and variadic ops with NumPy (multidirectional) broadcasting:
Add Sub Mul Div Pow Mod BitShift BitwiseAnd/Or/Xor And Or Xor, the comparisons, Sum Mean
Max Min, Clip and Where.

Compute functions are ``fn(a, b, out=None)`` (variadic: ``fn(*xs, out=None)``; Clip:
``fn(x, min=None, max=None, out=None)``; Where: ``fn(cond, x, y, out=None)``). ONNX
gives both operands one type, so a NumPy ufunc keeps it; where NumPy differs from ONNX the
kernel says so: integer Div truncates toward zero, Pow returns the base's dtype, Mod
follows ``fmod``. Opsets before 7 broadcast B only with ``broadcast=1`` (and ``axis``);
that is honoured by reshaping B.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import OUT, OUT_INPLACE, ComputeFn, KernelBuilder, KernelContext, KernelFlags
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _legacy_broadcast(ctx: KernelContext, fn: ComputeFn) -> ComputeFn:
    """Opset < 7 ``broadcast=1, axis=k``: B's dims align with A's starting at axis k."""
    if ctx.opset >= 7 or not ctx.attr("broadcast", 0):
        return fn
    axis = ctx.attr("axis", None)
    if axis is None:
        return fn  # suffix alignment: what NumPy does anyway
    axis = int(axis)

    def legacy(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> Any:
        ax = axis if axis >= 0 else axis + a.ndim
        b = b.reshape(b.shape + (1,) * (a.ndim - ax - b.ndim))
        return fn(a, b, out=out)

    return legacy


def _binary_builder(uf: np.ufunc) -> KernelBuilder:
    def build(ctx: KernelContext) -> ComputeFn:
        """The ufunc itself, ``fn(a, b, out=None)``; same dtype in and out."""
        return _legacy_broadcast(ctx, uf)

    return build


# -- Div -----------------------------------------------------------------------------------
def _trunc_div(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> Any:
    """Signed integer division rounding toward zero (C semantics), as ONNX Div."""
    q, r = (np.asarray(v) for v in np.divmod(a, b))
    fix = np.asarray(np.not_equal(r, 0))
    fix &= q < 0  # floor and trunc differ only for inexact negative quotients
    q += fix
    if out is None:
        return q
    np.copyto(out, q)
    return out


def _div_any(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> Any:
    k = a.dtype.kind
    if k == "i":
        return _trunc_div(a, b, out)
    if k == "u":
        return np.floor_divide(a, b, out=out)
    return np.divide(a, b, out=out)


def _div(ctx: KernelContext) -> ComputeFn:
    """Div(a, b): true division for floats; integers truncate toward zero."""
    dt = ctx.input_dtype(0)
    fn: ComputeFn = _div_any
    if dt is not None:
        if dt.kind == "i":
            fn = _trunc_div
        elif dt.kind == "u":
            fn = np.floor_divide
        elif dt.kind == "f":
            fn = np.divide
    return _legacy_broadcast(ctx, fn)


# -- Pow -----------------------------------------------------------------------------------
def _pow_any(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> Any:
    """Pow with the base's dtype for any base/exponent types."""
    ka = a.dtype.kind
    if ka == "f" and b.dtype == a.dtype:
        return np.power(a, b, out=out)
    if ka in "iu" and b.dtype.kind in "iu":
        try:
            return np.power(a, b.astype(a.dtype, copy=False), out=out)
        except ValueError:  # negative integer exponent: via float64 like C's pow
            pass
    wide = a.dtype if ka == "f" else np.dtype(np.float64 if ka in "iu" else np.float32)
    r = np.power(a.astype(wide, copy=False), b.astype(wide, copy=False))
    if out is None:
        return r.astype(a.dtype, copy=False)
    np.copyto(out, r, casting="unsafe")
    return out


def _pow(ctx: KernelContext) -> ComputeFn:
    """Pow(a, b) -> a's dtype. A constant scalar exponent is read at load (2 -> square,
    3 -> cube for floats: libm's pow is ~300x slower than two multiplies, and onnxruntime
    special-cases both the same way; GPT-2's GELU computes x**3)."""
    e = ctx.const_input(1)
    dt = ctx.input_dtype(0)
    t = ctx.input_type(0)
    rank = None if t is None else t.rank
    if (
        e is not None
        and e.size == 1
        and dt is not None
        and dt.kind in "fiu"
        and (e.ndim == 0 or (rank is not None and e.ndim <= rank))
    ):
        ev = e.reshape(()).item()
        if ev == 2:
            return _ignore_b(np.square)
        if ev == 3 and dt.kind == "f":
            return _cube
        if dt.kind == "f" or (isinstance(ev, int) and ev >= 0):
            return _ignore_b(np.power, float(ev) if dt.kind == "f" else int(ev))
    if dt is not None and dt.kind == "f" and ctx.input_dtype(1) == dt:
        return _legacy_broadcast(ctx, np.power)
    return _legacy_broadcast(ctx, _pow_any)


def _cube(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> Any:
    """``a * a * a`` (``out`` may alias ``a``: the second multiply reads each element of
    ``a`` before writing it)."""
    return np.multiply(np.square(a), a, out=out)


def _ignore_b(uf: np.ufunc, *args: Any) -> ComputeFn:
    """``fn(a, b, out=None) = uf(a, *args)``: b was folded in at load."""

    def unary(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> Any:
        return uf(a, *args, out=out)

    return unary


# -- Mod, BitShift ---------------------------------------------------------------------
def _mod(ctx: KernelContext) -> ComputeFn:
    """Mod(a, b): fmod=0 -> sign of b (np.mod); fmod=1 -> sign of a (np.fmod)."""
    return np.fmod if int(ctx.attr("fmod", 0)) else np.mod


def _bitshift(ctx: KernelContext) -> ComputeFn:
    """BitShift(x, y), direction LEFT/RIGHT; NumPy gives 0 (or -1 for a negative x shifted
    right) when y is negative or >= the bit width, as ONNX says."""
    direction = ctx.attr("direction")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction == "LEFT":
        return np.left_shift
    if direction == "RIGHT":
        return np.right_shift
    raise ctx.unsupported(f"direction={direction!r}")


# -- variadic Sum, Mean, Max, Min ------------------------------------------------------
def _fold(uf: np.ufunc, n: int) -> ComputeFn:
    """uf folded over n broadcast inputs."""
    if n == 1:

        def one(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            if out is None:
                return x
            np.copyto(out, x)
            return out

        return one
    if n == 2:
        return uf

    def many(*xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        r = np.asarray(uf(xs[0], xs[1], out=out))
        for x in xs[2:]:
            if out is not None or x.shape == r.shape:
                uf(r, x, out=r)
            else:
                r = np.asarray(uf(r, x))
        return r

    return many


def _variadic_builder(uf: np.ufunc) -> KernelBuilder:
    def build(ctx: KernelContext) -> ComputeFn:
        """uf folded over all inputs, ``fn(*xs, out=None)``."""
        if ctx.n_inputs < 1:
            raise ctx.unsupported("needs at least one input")
        return _fold(uf, ctx.n_inputs)

    return build


def _mean(ctx: KernelContext) -> ComputeFn:
    """Mean(*xs) = Sum(*xs) / n, in the inputs' float dtype."""
    n = ctx.n_inputs
    if n < 1:
        raise ctx.unsupported("needs at least one input")
    if n == 1:
        return _fold(np.add, 1)
    total = _fold(np.add, n)

    def mean(*xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        r = total(*xs, out=out)
        return np.divide(r, n, out=r if isinstance(r, np.ndarray) else None)

    return mean


# -- Clip ------------------------------------------------------------------------------
def _bound(v: np.ndarray | None) -> np.ndarray | None:
    return None if v is None else np.asarray(v).reshape(())


def _clip_const(lo: Any, hi: Any) -> ComputeFn:
    """Clip with bounds fixed at load (None = unbounded); max wins when min > max."""
    if lo is None and hi is None:
        return _clip_dynamic  # identity
    if hi is None:

        def clip_lo(x: np.ndarray, *_: Any, out: np.ndarray | None = None) -> Any:
            return np.maximum(x, lo, out=out)

        return clip_lo
    if lo is None:

        def clip_hi(x: np.ndarray, *_: Any, out: np.ndarray | None = None) -> Any:
            return np.minimum(x, hi, out=out)

        return clip_hi

    def clip(x: np.ndarray, *_: Any, out: np.ndarray | None = None) -> Any:
        r = np.asarray(np.maximum(x, lo, out=out))
        return np.minimum(r, hi, out=r)

    return clip


def _clip_dynamic(
    x: np.ndarray,
    lo: np.ndarray | None = None,
    hi: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> Any:
    if lo is not None:
        r = np.asarray(np.maximum(x, lo, out=out))
        if hi is not None:
            np.minimum(r, hi, out=r)
        return r
    if hi is not None:
        return np.minimum(x, hi, out=out)
    if out is None:
        return x
    np.copyto(out, x)
    return out


def _clip(ctx: KernelContext) -> ComputeFn:
    """Clip(x, min, max): attributes before opset 11, optional inputs after (read at load
    when constant). Output = min(max(x, min), max)."""
    if ctx.opset < 11:
        lo_a = ctx.attr("min", None)
        hi_a = ctx.attr("max", None)
        dt = ctx.input_dtype(0)
        if dt is not None and dt.kind == "f":
            return _clip_const(
                None if lo_a is None else np.asarray(lo_a, dt),
                None if hi_a is None else np.asarray(hi_a, dt),
            )
        return _clip_const(lo_a, hi_a)
    lo_const = not ctx.has_input(1) or ctx.const_input(1) is not None
    hi_const = not ctx.has_input(2) or ctx.const_input(2) is not None
    if lo_const and hi_const:
        return _clip_const(_bound(ctx.const_input(1)), _bound(ctx.const_input(2)))
    return _clip_dynamic


# -- Where -----------------------------------------------------------------------------
def _where(ctx: KernelContext) -> ComputeFn:
    """Where(cond, x, y): x where cond else y, broadcast."""

    def where(c: np.ndarray, x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> Any:
        if out is None:
            return np.where(c, x, y)
        np.copyto(out, y)
        np.copyto(out, x, where=c)
        return out

    return where


_BINARY: dict[str, tuple[np.ufunc, int, KernelFlags]] = {
    "Add": (np.add, 1, OUT_INPLACE),
    "Sub": (np.subtract, 1, OUT_INPLACE),
    "Mul": (np.multiply, 1, OUT_INPLACE),
    "BitwiseAnd": (np.bitwise_and, 18, OUT_INPLACE),
    "BitwiseOr": (np.bitwise_or, 18, OUT_INPLACE),
    "BitwiseXor": (np.bitwise_xor, 18, OUT_INPLACE),
    "And": (np.logical_and, 1, OUT_INPLACE),
    "Or": (np.logical_or, 1, OUT_INPLACE),
    "Xor": (np.logical_xor, 1, OUT_INPLACE),
    "Equal": (np.equal, 1, OUT),
    "Greater": (np.greater, 1, OUT),
    "GreaterOrEqual": (np.greater_equal, 12, OUT),
    "Less": (np.less, 1, OUT),
    "LessOrEqual": (np.less_equal, 12, OUT),
}


def register_kernels(registry: KernelRegistry) -> None:
    """Register the binary, variadic, Clip and Where kernels."""
    for op, (uf, since, flags) in _BINARY.items():
        registry.add(op, _binary_builder(uf), since=since, flags=flags)
    registry.add("Div", _div, since=1, flags=OUT_INPLACE)
    registry.add("Pow", _pow, since=1, flags=OUT_INPLACE)
    registry.add("Mod", _mod, since=10, flags=OUT_INPLACE)
    registry.add("BitShift", _bitshift, since=11, flags=OUT_INPLACE)
    registry.add("Sum", _variadic_builder(np.add), since=1, flags=OUT_INPLACE)
    registry.add("Max", _variadic_builder(np.maximum), since=1, flags=OUT_INPLACE)
    registry.add("Min", _variadic_builder(np.minimum), since=1, flags=OUT_INPLACE)
    registry.add("Mean", _mean, since=1, flags=OUT_INPLACE)
    registry.add("Clip", _clip, since=1, flags=OUT_INPLACE)
    registry.add("Where", _where, since=9, flags=OUT)
