"""Kernels (nn): normalizations — BatchNormalization, LayerNormalization, RMSNormalization,
LpNormalization (here); InstanceNormalization, GroupNormalization, LRN,
MeanVarianceNormalization (``norm_group``).

* BatchNormalization: inference ``y = (x - mean) / sqrt(var + eps) * scale + B`` per
  channel (axis 1). When scale/B/mean/var are constants the builder folds them into one
  per-channel multiplier and shift, so a call is one multiply-add. ``training_mode=1``
  (opset 14+) uses the batch statistics and also returns the running mean and variance.
  Opsets before 9 with ``spatial=0`` take per-activation parameters [C, D1, ...].
* LayerNormalization (17): normalizes over axes ``axis..rank-1`` in ``stash_type``
  precision; optional outputs Mean and InvStdDev of shape ``d[:axis] + [1] * ...``
  (stash dtype).
* RMSNormalization (23): ``x / sqrt(mean(x^2) + eps) * scale`` over axes ``axis..``.
* LpNormalization: ``x / ||x||_p`` along ``axis`` (p 1 or 2); a zero norm gives 0.

Outputs keep X's dtype. Single-output forms accept ``out=``.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from ..base import OUT, OUT_INPLACE, ComputeFn, KernelContext
from ..common import stash_dtype
from ..lib.norm_jit import layer_norm_rows, rms_norm_rows
from ..registry import KernelRegistry
from .norm_group import row_stats

__all__ = ["register_kernels"]

_sum = np.add.reduce
#: ndarray, short for BatchNormalization's per-call signatures (X, scale, B, mean, var, out).
_Array: TypeAlias = np.ndarray


# -- BatchNormalization ------------------------------------------------------------------


def _batch_normalization(ctx: KernelContext) -> ComputeFn:
    """BatchNormalization: ``fn(X, scale, B, mean, var, out=None)`` -> Y, or
    (Y, running_mean, running_var) with ``training_mode=1``."""
    eps = float(ctx.attr("epsilon", 1e-5))
    momentum = float(ctx.attr("momentum", 0.9))
    training = ctx.opset >= 14 and bool(ctx.attr("training_mode", 0))
    spatial = ctx.opset >= 9 or bool(ctx.attr("spatial", 1))
    if not training and any(ctx.has_output(i) for i in range(1, ctx.n_outputs)):
        raise ctx.unsupported("training outputs (mean/var) are only supported with opset 14+")
    if training:
        return _batch_norm_training(ctx, eps, momentum)

    t = ctx.input_type(0)
    rank = t.rank if t is not None else None
    xdt = ctx.input_dtype(0)

    def shape_for(p: np.ndarray, ndim: int) -> np.ndarray:
        return p.reshape(-1, *(1,) * (ndim - 2)) if spatial else p

    consts = [ctx.const_input(i) for i in range(1, 5)]
    if all(c is not None for c in consts):
        s, b, m, v = (np.asarray(c, dtype=np.float64) for c in consts)
        a64 = s / np.sqrt(v + eps)
        dt = xdt if xdt is not None else np.dtype(consts[0].dtype)  # type: ignore[union-attr]
        a1, sh1 = a64.astype(dt), (b - m * a64).astype(dt)
        # Pre-shaped for the known rank; otherwise reshaped per call (a cheap view).
        a_r = shape_for(a1, rank) if rank is not None else None
        sh_r = shape_for(sh1, rank) if rank is not None else None

        def batch_norm_folded(x: np.ndarray, *_: Any, out: np.ndarray | None = None) -> np.ndarray:
            a, sh = a_r, sh_r
            if a is None or a.ndim != (x.ndim - 1 if spatial else a1.ndim) or x.dtype != dt:
                a = shape_for(a1, x.ndim).astype(x.dtype, copy=False)
                sh = shape_for(sh1, x.ndim).astype(x.dtype, copy=False)
            y = np.multiply(x, a, out=out)
            y += sh
            return y

        return batch_norm_folded

    def batch_norm(
        x: _Array, s: _Array, b: _Array, m: _Array, v: _Array, out: _Array | None = None
    ) -> np.ndarray:
        a = s / np.sqrt(v + eps)
        sh = b - m * a
        y = np.multiply(x, shape_for(a, x.ndim).astype(x.dtype, copy=False), out=out)
        y += shape_for(sh, x.ndim).astype(x.dtype, copy=False)
        return y

    return batch_norm


def _batch_norm_training(ctx: KernelContext, eps: float, momentum: float) -> ComputeFn:
    n_out = ctx.n_outputs

    def batch_norm_train(
        x: _Array, s: _Array, b: _Array, m: _Array, v: _Array, out: _Array | None = None
    ) -> Any:
        axes = (0, *range(2, x.ndim))
        xf = x.astype(np.float32) if x.dtype == np.float16 else x
        cm = np.mean(xf, axis=axes)
        cv = np.var(xf, axis=axes)
        bshape = (-1, *(1,) * (x.ndim - 2))
        a = s / np.sqrt(cv + eps)
        y = (xf * a.reshape(bshape) + (b - cm * a).reshape(bshape)).astype(x.dtype)
        rm = (m * momentum + cm * (1 - momentum)).astype(m.dtype)
        rv = (v * momentum + cv * (1 - momentum)).astype(v.dtype)
        if n_out > 1:
            return (y, rm, rv)[:n_out]
        if out is not None:
            np.copyto(out, y)
            return out
        return y

    return batch_norm_train


# -- LayerNormalization / RMSNormalization ------------------------------------------------


def _split(x: np.ndarray, axis: int) -> tuple[int, int, int]:
    """(normalized axis, rows, cols) of ``x`` seen as a matrix split at ``axis``."""
    a = axis + x.ndim if axis < 0 else axis
    cols = 1
    for d in x.shape[a:]:
        cols *= d
    return a, (x.size // cols if cols else 0), cols


def _row_param(p: Any, tail: tuple[int, ...], nd: int, dt: np.dtype) -> np.ndarray | None:
    """``p`` (Scale or B) as one value per column of the normalized rows, when it
    broadcasts to the normalized axes ``tail`` without growing them or the result (rank at
    most ``nd``, leading dims 1) and has dtype ``dt``; else None."""
    if not isinstance(p, np.ndarray) or p.dtype != dt or p.ndim > nd:
        return None
    k = p.ndim - len(tail)
    if k < 0 or p.shape[k:] != tail or any(d != 1 for d in p.shape[:k]):
        return None
    return p.reshape(-1)


_NO_BIAS = {np.dtype(np.float32): np.zeros(0, np.float32), np.dtype(np.float64): np.zeros(0)}


class _ParamMemo:
    """The last (scale, bias, normalized shape) a kernel checked and what ``_row_param``
    made of them: a model passes its constant Scale and B, the same objects at every
    call, so the checks (~3 µs) run once. Holds references (no id reuse); one slot per
    kernel, replaced whole (a tuple), so concurrent callers see one consistent entry."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple[Any, ...] = (None, None, None, None, None)

    def params(self, scale: Any, bias: Any, tail: tuple[int, ...], nd: int,
               stash: np.dtype, rms: bool) -> tuple[Any, Any]:  # fmt: skip
        last = self.last
        if last[0] is scale and last[1] is bias and last[2] == (tail, nd):
            return last[3], last[4]
        s = _row_param(scale, tail, nd, stash)
        b = _NO_BIAS[stash] if bias is None or rms else _row_param(bias, tail, nd, stash)
        self.last = (scale, bias, (tail, nd), s, b)
        return s, b


def _compiled_rows(fn: Any, x: np.ndarray, scale: Any, bias: Any, out: Any, axis: int,
                   eps: float, stash: np.dtype, rms: bool,
                   memo: _ParamMemo) -> np.ndarray | None:  # fmt: skip
    """LayerNormalization (``bias`` None: none) or, ``rms``, RMSNormalization (``bias``
    unused) of ``x`` by the compiled rows ``fn`` (``norm_jit``); None when
    the call does not fit them (dtype other than the stash type, an aliasing ``out``,
    parameters that grow the result, an axis out of range: the NumPy path handles and
    reports those). A strided ``x`` (a transposed view: MobileViT's unfolded patches) is
    copied once first: the NumPy path's passes over it took 5x the time (4x256x64: 338
    against 65 µs)."""
    if x.dtype != stash or x.size == 0:
        return None
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a < x.ndim:
        return None
    s, b = memo.params(scale, bias, x.shape[a:], x.ndim, stash, rms)
    if s is None or b is None:
        return None
    if out is None:
        out = np.empty_like(x)
    elif not out.flags.c_contiguous or out.shape != x.shape or np.may_share_memory(x, out):
        return None
    cols = s.shape[0]
    if rms:
        fn(x.reshape(-1, cols), s, eps, out.reshape(-1, cols))
    else:
        fn(x.reshape(-1, cols), s, b, eps, out.reshape(-1, cols))
    return out


def _layer_norm_fast(axis: int, eps: float, stash: np.dtype) -> Any:
    """The compiled one-pass form for the single-output op, or None: its
    ``fn(x, scale, bias, out)`` returns None when a call does not fit it
    (``_compiled_rows``)."""
    rows_fn = layer_norm_rows(stash)
    if rows_fn is None:
        return None

    memo = _ParamMemo()

    def fast(x: np.ndarray, scale: Any, bias: Any, out: np.ndarray | None) -> Any:
        return _compiled_rows(rows_fn, x, scale, bias, out, axis, eps, stash, False, memo)

    return fast


def _layer_normalization(ctx: KernelContext) -> ComputeFn:
    """LayerNormalization: ``fn(X, Scale, B=None, out=None)`` -> Y or (Y, Mean, InvStdDev)."""
    axis = int(ctx.attr("axis", -1))
    eps = float(ctx.attr("epsilon", 1e-5))
    stash = stash_dtype(ctx)
    n_out = ctx.n_outputs
    want_mean, want_inv = ctx.has_output(1), ctx.has_output(2)

    def layer_norm(
        x: np.ndarray, scale: np.ndarray, bias: Any = None, out: np.ndarray | None = None
    ) -> Any:
        a, rows, cols = _split(x, axis)
        xs = x.reshape(rows, cols)
        same = x.dtype == stash
        if not same:
            xs = xs.astype(stash)
        d_out = out.reshape(rows, cols) if same and out is not None else None
        d, mean, inv = row_stats(xs, eps, d_out)
        d *= inv
        y = d.reshape(x.shape)
        if not same:
            y = y.astype(x.dtype)
        if d_out is None:
            y = np.multiply(y, scale, out=out)
        else:
            y *= scale
        if bias is not None:
            y += bias
        if n_out == 1:
            return y if d_out is None else out
        st = x.shape[:a] + (1,) * (x.ndim - a)
        return (
            y,
            mean.reshape(st) if want_mean else None,
            inv.reshape(st) if want_inv else None,
        ) + (None,) * (n_out - 3)

    if n_out == 1:
        fast = _layer_norm_fast(axis, eps, stash)

        def layer_norm_y(
            x: np.ndarray, scale: np.ndarray, bias: Any = None, out: np.ndarray | None = None
        ) -> Any:
            if fast is not None:
                y = fast(x, scale, bias, out)
                if y is not None:
                    return y
            if out is not None and not out.flags.c_contiguous:
                np.copyto(out, layer_norm(x, scale, bias))
                return out
            return layer_norm(x, scale, bias, out)

        return layer_norm_y
    return layer_norm


def _rms_normalization(ctx: KernelContext) -> ComputeFn:
    """RMSNormalization: ``fn(X, scale, out=None) -> X / sqrt(mean(X^2) + eps) * scale``."""
    axis = int(ctx.attr("axis", -1))
    eps = float(ctx.attr("epsilon", 1e-5))
    stash = stash_dtype(ctx)

    rms_fn = rms_norm_rows(stash)
    memo = _ParamMemo()

    def rms_norm(x: np.ndarray, scale: np.ndarray, out: np.ndarray | None = None) -> Any:
        if rms_fn is not None:
            y = _compiled_rows(rms_fn, x, scale, None, out, axis, eps, stash, True, memo)
            if y is not None:
                return y
        _, rows, cols = _split(x, axis)
        xs = x.reshape(rows, cols)
        if x.dtype != stash:
            xs = xs.astype(stash)
        ms = np.einsum("ij,ij->i", xs, xs).reshape(-1, 1)
        ms *= 1.0 / max(cols, 1)
        ms += eps
        np.sqrt(ms, out=ms)
        np.reciprocal(ms, out=ms)
        y = (xs * ms).reshape(x.shape)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        return np.multiply(y, scale, out=out)

    return rms_norm


# -- LpNormalization -----------------------------------------------------------------------


def _lp_normalization(ctx: KernelContext) -> ComputeFn:
    """LpNormalization: ``fn(x, out=None) -> x / ||x||_p`` along ``axis`` (0 where norm 0)."""
    axis = int(ctx.attr("axis", -1))
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.unsupported(f"p={p} (only 1 and 2)")

    def lp_norm(x: np.ndarray, out: np.ndarray | None = None) -> Any:
        if p == 2:
            n = np.sqrt(_sum(np.square(x), axis=axis, keepdims=True))
        else:
            n = _sum(np.abs(x), axis=axis, keepdims=True)
        n[n == 0] = 1
        return np.divide(x, n, out=out)

    return lp_norm


def register_kernels(registry: KernelRegistry) -> None:
    """Register BatchNormalization, LayerNormalization, RMSNormalization, LpNormalization."""
    registry.add("BatchNormalization", _batch_normalization, since=1, flags=OUT_INPLACE)
    registry.add("LayerNormalization", _layer_normalization, since=17, flags=OUT)
    registry.add("RMSNormalization", _rms_normalization, since=23, flags=OUT)
    registry.add("LpNormalization", _lp_normalization, since=1, flags=OUT)
