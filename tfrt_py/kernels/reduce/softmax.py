"""Kernels (reduce): Softmax, LogSoftmax, Hardmax.

From opset 13 they work along the single axis ``axis`` (default -1). Before 13 the input
is seen as a 2-D matrix [prod(shape[:axis]), prod(shape[axis:])] (``axis`` default 1) and
the op works along its rows, i.e. jointly over every axis from ``axis`` on. The output has
the input's shape and dtype; all three accept ``out=``; Softmax and LogSoftmax may run in
place.

Speed: contiguous float32 Softmax along the last axes runs ``softmax_jit``'s compiled rows
(any size) when numba is there. Otherwise, along trailing axes of float32/float64 inputs,
Softmax/LogSoftmax shift by the
tensor's global max (or not at all when exp cannot overflow) and sum rows with one BLAS
matrix-vector product, avoiding NumPy's slow per-row max/sum reductions. When a row's sum
is too small for that shift to keep full precision (rows far below the global max), or the
input holds inf/NaN, they fall back to the classic per-row max shift. Results match the
per-row formulation to float rounding.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import OUT, OUT_INPLACE, ComputeFn, KernelContext
from ..common import ones_vector, scratch
from ..lib.addresses import same_start
from ..lib.softmax_jit import SHORT_ROW, softmax_rows_f32
from ..registry import KernelRegistry

__all__ = ["register_kernels"]

_max: Any = np.maximum.reduce
_sum: Any = np.add.reduce

#: exp(x) cannot overflow a row sum below these maxima (float32, float64) ...
_NO_SHIFT_MAX = {"f": 60.0, "d": 600.0}
#: ... and rows whose shifted exp-sum is at least this keep full relative precision.
_MIN_ROW_SUM = {"f": 1e-20, "d": 1e-200}
#: Below this many rows NumPy's per-row reductions are cheap; use the classic path.
_FAST_MIN_ROWS = 16


def _shifted_exp(x: np.ndarray, out: Any) -> tuple[np.ndarray, float] | None:
    """(exp(x - c), c) for float32/64 ``x`` with one scalar shift ``c``, or None (inf/NaN)."""
    ch = x.dtype.char
    g = float(_max(x, axis=None))
    if not math.isfinite(g):
        return None
    if g <= _NO_SHIFT_MAX[ch]:
        return np.exp(x, out=out), 0.0
    y = np.subtract(x, x.dtype.type(g), out=out)
    return np.exp(y, out=y), g


def _softmax_rows(x: np.ndarray, a: int, out: Any) -> np.ndarray | None:
    """Fast Softmax over axes ``a..`` (see module doc), or None to use the classic path."""
    if (
        x.dtype.char not in "fd"
        or x.size == 0
        or not x.flags.c_contiguous
        or (out is not None and not out.flags.c_contiguous)
    ):
        return None
    # In place (out is x): the exponentials go to scratch, so x is intact when the row-sum
    # test sends the call to the classic path; the division then writes out.
    alias = out is not None and np.may_share_memory(x, out)
    r = _shifted_exp(x, scratch(2, x.shape, x.dtype) if alias else out)
    if r is None:
        return None
    y = r[0]
    y2 = y.reshape(math.prod(x.shape[:a]), -1)
    s = np.dot(y2, ones_vector(y2.shape[1], x.dtype.char))
    if not s.min() >= _MIN_ROW_SUM[x.dtype.char]:
        return None
    if alias:
        np.divide(y2, s.reshape(-1, 1), out=out.reshape(y2.shape))
        return out
    np.divide(y2, s.reshape(-1, 1), out=y2)
    return y


def _log_softmax_rows(x: np.ndarray, a: int, out: Any) -> np.ndarray | None:
    """Fast LogSoftmax over axes ``a..``: ``x - (c + log(sum(exp(x - c))))``; writes ``out``
    only once it succeeds (so ``out`` may alias ``x``)."""
    if x.dtype.char not in "fd" or x.size == 0:
        return None
    r = _shifted_exp(x, None)
    if r is None:
        return None
    e, c = r
    e2 = e.reshape(math.prod(x.shape[:a]), -1)
    s = np.dot(e2, ones_vector(e2.shape[1], x.dtype.char))
    if not s.min() >= _MIN_ROW_SUM[x.dtype.char]:
        return None
    np.log(s, out=s)
    if c:
        s += c
    return np.subtract(x, s.reshape(x.shape[:a] + (1,) * (x.ndim - a)), out=out)


def _empty(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The (empty) result for an input with no elements: NumPy's max/argmax refuse them."""
    return np.empty(x.shape, x.dtype) if out is None else out


def _classic_softmax(x: np.ndarray, ax: Any, out: Any) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # all -inf rows give NaN, as the reference
        y = np.subtract(x, _max(x, axis=ax, keepdims=True), out=out)
    np.exp(y, out=y)
    return np.divide(y, _sum(y, axis=ax, keepdims=True), out=y)


def _classic_log_softmax(x: np.ndarray, ax: Any, out: Any) -> np.ndarray:
    m = _max(x, axis=ax, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = _sum(np.exp(x - m), axis=ax, keepdims=True)
        np.log(s, out=s)
        s += m
        return np.subtract(x, s, out=out)


def _axis_attr(ctx: KernelContext) -> tuple[int, bool]:
    """(axis, legacy): legacy (opset < 13) works jointly on axes ``axis..``."""
    if ctx.opset >= 13:
        return int(ctx.attr("axis", -1)), False
    return int(ctx.attr("axis", 1)), True


def _softmax_like(ctx: KernelContext, rows: Any, classic: Any) -> ComputeFn:
    """Softmax and LogSoftmax share their axis handling: ``rows`` (the fast last-axis path,
    None when it does not apply) for many rows, else ``classic`` over the axis (opset >= 13)
    or the flattened trailing axes (legacy)."""
    axis, legacy = _axis_attr(ctx)

    def compute(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.size == 0:
            return _empty(x, out)
        nd = x.ndim
        a = axis + nd if axis < 0 else axis
        if (legacy or a == nd - 1) and math.prod(x.shape[:a]) >= _FAST_MIN_ROWS:
            y = rows(x, a, out)
            if y is not None:
                return y
        if legacy:
            return classic(x, tuple(range(a, nd)), out)
        return classic(x, a, out)

    return compute


def _softmax(ctx: KernelContext) -> ComputeFn:
    """Softmax: ``fn(x, out=None) -> exp(x - max) / sum(exp(x - max))`` along the axis.
    Contiguous float32 inputs along the last axes take the compiled rows (``softmax_jit``)
    when numba is there."""
    general = _softmax_like(ctx, _softmax_rows, _classic_softmax)
    jit = softmax_rows_f32()
    if jit is None:
        return general
    axis, legacy = _axis_attr(ctx)

    def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        nd = x.ndim
        if nd and x.dtype == np.float32 and x.size and x.flags.c_contiguous:
            a = axis + nd if axis < 0 else axis
            if (legacy and 0 <= a < nd) or a == nd - 1:
                n = math.prod(x.shape[a:])
                rows = x.size // n
                y = _jit_out(x, out, n <= SHORT_ROW)
                if y is not None:
                    jit(x.reshape(rows, n), y.reshape(rows, n))
                    return y
        return general(x, out)

    return softmax


def _jit_out(x: np.ndarray, out: np.ndarray | None, short: bool) -> np.ndarray | None:
    """Where the compiled rows may write: a new array, or ``out`` when it is contiguous of
    ``x``'s shape and dtype and either separate from ``x`` or ``x``'s own buffer (in
    place); None (a partial overlap, a strided ``out``): the NumPy path. ``short`` rows
    read all of ``x`` before writing ``y`` (``softmax_jit``), so any overlap is fine and
    the overlap test is skipped."""
    if out is None:
        return np.empty_like(x)
    if not out.flags.c_contiguous or out.shape != x.shape or out.dtype != x.dtype:
        return None
    if short or out is x:
        return out
    if np.may_share_memory(x, out) and not same_start(out, x):
        return None
    return out


def _log_softmax(ctx: KernelContext) -> ComputeFn:
    """LogSoftmax: ``fn(x, out=None) -> x - max - log(sum(exp(x - max)))`` along the axis."""
    return _softmax_like(ctx, _log_softmax_rows, _classic_log_softmax)


def _hardmax(ctx: KernelContext) -> ComputeFn:
    """Hardmax: ``fn(x, out=None)``: 1 at the first maximum along the axis, else 0."""
    if ctx.opset >= 13:
        axis = int(ctx.attr("axis", -1))

        def hardmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            if x.size == 0:
                return _empty(x, out)
            idx = np.argmax(x, axis=axis, keepdims=True)
            if out is None:
                out = np.zeros(x.shape, dtype=x.dtype)
            else:
                out.fill(0)
            np.put_along_axis(out, idx, 1, axis=axis)
            return out

        return hardmax

    axis = int(ctx.attr("axis", 1))

    def hardmax_2d(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.size == 0:
            return _empty(x, out)
        a = axis + x.ndim if axis < 0 else axis
        rows = int(np.prod(x.shape[:a], dtype=np.int64))
        x2 = x.reshape(rows, -1)
        y = np.zeros(x2.shape, dtype=x.dtype)
        if x2.shape[1]:
            y[np.arange(rows), np.argmax(x2, axis=1)] = 1
        y = y.reshape(x.shape)
        if out is None:
            return y
        np.copyto(out, y)
        return out

    return hardmax_2d


def register_kernels(registry: KernelRegistry) -> None:
    """Register Softmax, LogSoftmax, Hardmax (all opsets; the builder handles 13's change)."""
    registry.add("Softmax", _softmax, since=1, flags=OUT_INPLACE)
    registry.add("LogSoftmax", _log_softmax, since=1, flags=OUT_INPLACE)
    registry.add("Hardmax", _hardmax, since=1, flags=OUT)
