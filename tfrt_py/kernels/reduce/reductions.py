"""Kernels (reduce): ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare.

Axes are an attribute up to the opset where they became the optional second input (13 for
ReduceSum, 18 for the others). Constant axes are resolved at load; runtime axes are read
per call. No axes reduces everything, unless ``noop_with_empty_axes`` (input form only),
which makes the op an identity. ``keepdims`` defaults to 1. Reductions over an empty set
give the op's identity: 0 (Sum, L1, L2, SumSquare), 1 (Prod), -inf (Max, LogSum,
LogSumExp; the dtype's minimum / False for integers / bool), +inf (Min). The output dtype
is the input's (NumPy would widen int sums and give float for int means).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..base import OUT, ComputeFn, KernelContext
from ..common import const_ints, ones_vector
from ..registry import KernelRegistry

__all__ = ["register_kernels"]

Axis = tuple[int, ...] | None
#: core(x, axis, out) -> reduced array; keepdims is bound at load.
Core = Callable[[np.ndarray, Axis, Any], Any]


def _finish(r: Any, dt: np.dtype, out: np.ndarray | None) -> Any:
    """Cast ``r`` to the input dtype ``dt`` and write it into ``out`` when given."""
    if out is not None:
        out[...] = r
        return out
    if r.dtype != dt:
        return np.asarray(r).astype(dt)
    return r


def _empty_extreme(dt: np.dtype, want_max: bool) -> Any:
    """The identity of max (``want_max``) or min for dtype ``dt``."""
    if dt.kind == "f":
        return -np.inf if want_max else np.inf
    if dt.kind == "b":
        return not want_max
    info = np.iinfo(dt)
    return info.min if want_max else info.max


def _sum(kd: bool) -> Core:
    add: Any = np.add.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        return add(x, axis=axis, dtype=x.dtype, keepdims=kd, out=out)

    return core


def _squares_in_order(x: np.ndarray, axis: Axis, kd: bool) -> np.ndarray | None:
    """The sum of ``x``'s squares over one axis of a float32/64 array, each square rounded and
    added in the axis's order, as onnxruntime sums them (``np.add.reduce`` sums pairwise:
    last bits apart, which a model that subtracts large, nearly equal sums of squares, a
    GaussianMixture's, turns into 1e-4 of its probabilities); None for other cases."""
    if x.dtype.char not in "fd" or axis is None or len(axis) != 1:
        return None
    a = axis[0]
    if not -x.ndim <= a < x.ndim or x.shape[a] == 0:
        return None  # (NumPy's reduction answers these as before)
    sums = np.add.accumulate(np.square(x), axis=a)  # (accumulate adds in order)
    return np.take(sums, [-1] if kd else -1, axis=a)


def _sum_square(kd: bool) -> Core:
    add: Any = np.add.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        r = _squares_in_order(x, axis, kd)
        if r is None:
            return add(np.square(x), axis=axis, dtype=x.dtype, keepdims=kd, out=out)
        return _finish(r, x.dtype, out)

    return core


def _l1(kd: bool) -> Core:
    add: Any = np.add.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        return add(np.abs(x), axis=axis, dtype=x.dtype, keepdims=kd, out=out)

    return core


def _l2(kd: bool) -> Core:
    add: Any = np.add.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        if x.dtype.kind == "f":
            r = _squares_in_order(x, axis, kd)
            if r is None:
                r = add(np.square(x), axis=axis, keepdims=kd, out=out)
            return np.sqrt(r, out=out)
        r = np.sqrt(add(np.square(x), axis=axis, dtype=x.dtype, keepdims=kd))
        return _finish(r, x.dtype, out)

    return core


def _prod(kd: bool) -> Core:
    mul: Any = np.multiply.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        return mul(x, axis=axis, dtype=x.dtype, keepdims=kd, out=out)

    return core


def _mean(kd: bool) -> Core:
    add: Any = np.add.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        if x.dtype.kind != "f":
            r = np.mean(x, axis=axis, keepdims=kd)
            return _finish(r, x.dtype, out)
        r = add(x, axis=axis, keepdims=kd, out=out)
        size = np.size(r)
        n = x.size // size if size else 1
        if n == 0:  # mean of an empty set: undefined, NaN
            if out is None:
                return np.full(np.shape(r), np.nan, dtype=x.dtype)
            out.fill(np.nan)
            return out
        return np.multiply(r, 1.0 / n, out=out)

    return core


def _extreme(kd: bool, want_max: bool) -> Core:
    red: Any = np.maximum.reduce if want_max else np.minimum.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        if x.size == 0:
            ini = _empty_extreme(x.dtype, want_max)
            return red(x, axis=axis, keepdims=kd, out=out, initial=ini)
        return red(x, axis=axis, keepdims=kd, out=out)

    return core


def _log_sum(kd: bool) -> Core:
    add: Any = np.add.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        s = add(x, axis=axis, keepdims=kd)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(s)
        return _finish(r, x.dtype, out)

    return core


def _log_sum_exp(kd: bool) -> Core:
    mx: Any = np.maximum.reduce
    add: Any = np.add.reduce

    def core(x: np.ndarray, axis: Axis, out: Any) -> Any:
        if x.size == 0:
            m = mx(x, axis=axis, keepdims=True, initial=-np.inf)
        else:
            m = mx(x, axis=axis, keepdims=True)
        if not np.isfinite(m).all():
            m = np.where(np.isfinite(m), m, 0).astype(m.dtype)
        e = np.exp(x - m)
        s = add(e, axis=axis, keepdims=kd)
        with np.errstate(divide="ignore"):
            r = np.log(s)
        r += m if kd else m.reshape(np.shape(r))
        return _finish(r, x.dtype, out)

    return core


_CORES: dict[str, Callable[[bool], Core]] = {
    "ReduceSum": _sum,
    "ReduceSumSquare": _sum_square,
    "ReduceL1": _l1,
    "ReduceL2": _l2,
    "ReduceProd": _prod,
    "ReduceMean": _mean,
    "ReduceMax": lambda kd: _extreme(kd, True),
    "ReduceMin": lambda kd: _extreme(kd, False),
    "ReduceLogSum": _log_sum,
    "ReduceLogSumExp": _log_sum_exp,
}

#: The opset where each op's axes moved from attribute to input.
_AXES_INPUT_SINCE = {op: (13 if op == "ReduceSum" else 18) for op in _CORES}


def _identity(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return x
    np.copyto(out, x)
    return out


def _rank(ctx: KernelContext) -> int | None:
    t = ctx.input_type(0)
    return None if t is None else t.rank


def _trailing_count(axes: tuple[int, ...], rank: int | None) -> int:
    """k when ``axes`` are exactly the last k axes (for any rank when all are negative),
    else 0."""
    if not axes:
        return 0
    neg = sorted(a - rank if (a >= 0 and rank is not None) else a for a in axes)
    k = len(neg)
    return k if neg == list(range(-k, 0)) else 0


#: Below this many elements NumPy's reduction is as fast as the BLAS row-sum path.
_BLAS_MIN_SIZE = 2048


def _trailing_sum(core: Core, axis: Axis, k: int, kd: bool, mean: bool) -> ComputeFn:
    """ReduceSum/ReduceMean over the last ``k`` axes: rows of a C-contiguous float32/64
    input are summed by one BLAS matrix-vector product (several times faster)."""
    tail = (1,) * k if kd else ()

    def reduce_trailing(x: np.ndarray, axes: Any = None, out: Any = None) -> Any:
        ch = x.dtype.char
        if x.size < _BLAS_MIN_SIZE or ch not in "fd" or not x.flags.c_contiguous or x.ndim < k:
            return core(x, axis, out)
        lead = x.shape[: x.ndim - k]
        n = x.size // math.prod(lead)
        r = np.dot(x.reshape(-1, n), ones_vector(n, ch)).reshape(lead + tail)
        if mean:
            r *= 1.0 / n
        if out is None:
            return r
        np.copyto(out, r)
        return out

    return reduce_trailing


def _reduce(ctx: KernelContext) -> ComputeFn:
    """Reduce*: ``fn(data, axes=None, out=None) -> reduced``.

    Axes come from the ``axes`` attribute before the op's input opset, else from the
    optional constant or runtime second input (empty/omitted -> all axes, or identity with
    ``noop_with_empty_axes``).
    """
    keepdims = bool(ctx.attr("keepdims", 1))
    core = _CORES[ctx.op_type](keepdims)
    if ctx.opset < _AXES_INPUT_SINCE[ctx.op_type]:
        attr_axes = ctx.attr("axes", None)
        static: tuple[int, ...] | None = tuple(int(a) for a in attr_axes or ())
        noop = False
    else:
        noop = bool(ctx.attr("noop_with_empty_axes", 0))
        static = const_ints(ctx, 1) if ctx.has_input(1) else ()

    if static is not None:
        if not static and noop:

            def reduce_noop(x: np.ndarray, axes: Any = None, out: Any = None) -> Any:
                return _identity(x, out)

            return reduce_noop
        axis: Axis = static or None
        k = _trailing_count(static, _rank(ctx))
        if k and ctx.op_type in ("ReduceSum", "ReduceMean"):
            return _trailing_sum(core, axis, k, keepdims, ctx.op_type == "ReduceMean")

        def reduce_static(x: np.ndarray, axes: Any = None, out: Any = None) -> Any:
            return core(x, axis, out)

        return reduce_static

    def reduce_dynamic(x: np.ndarray, axes: Any = None, out: Any = None) -> Any:
        if axes is None or axes.size == 0:
            if noop:
                return _identity(x, out)
            return core(x, None, out)
        return core(x, tuple(axes.reshape(-1).tolist()), out)

    return reduce_dynamic


def register_kernels(registry: KernelRegistry) -> None:
    """Register the Reduce* ops (one builder serves them all)."""
    for op in _CORES:
        registry.add(op, _reduce, since=1, flags=OUT)
