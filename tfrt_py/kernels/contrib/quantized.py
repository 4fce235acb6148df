"""Kernels (contrib): onnxruntime's quantized operators in the QOperator format that
``onnxruntime.quantization.quantize_static`` writes -- QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearConcat, QGemm.

Each computes what onnxruntime's CPU provider computes: the inputs dequantized with their
(per-tensor) scale and zero point, the float op, the result quantized with the output's
scale and zero point, rounded half to even and saturated to the output type (the output
zero point's, else the first input's). The unary ops go through a 256-entry table made
per call from the scales (onnxruntime builds the same table). QGemm accumulates
``(A - a_zp) @ (B - b_zp) + C`` exactly (``linalg.matmul_integer``'s float BLAS) and
requantizes per output column (``lib.quant.requantize``), or returns float32 without an
output zero point. Results may differ from onnxruntime's by one unit where a value falls
on a rounding boundary (its vector paths round products of scales in float32).

A constant scale that is not a positive finite number, or a constant zero point or scale
with more than one element where one is required, is a load error naming the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..lib.quant import requantize
from ..linalg.matmul_integer import _a_side, _b_side, _cdt
from ..registry import KernelRegistry
from .activation import MS_DOMAIN

__all__ = ["register_kernels"]

_F32 = np.float32
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _check_scalars(ctx: KernelContext, idx: tuple[int, ...], scales: tuple[int, ...]) -> None:
    """Load-time checks of the constant per-tensor scales and zero points."""
    for i in idx:
        if not ctx.has_input(i):
            continue
        c = ctx.const_input(i)
        if c is None:
            continue
        if np.asarray(c).size != 1:
            raise ctx.unsupported(f"input {i} must hold one value (per-tensor), not {np.shape(c)}")
        if i in scales:
            v = float(np.asarray(c).reshape(-1)[0])
            if not np.isfinite(v) or v <= 0:
                raise ctx.unsupported(f"input {i} (a scale) is {v}: it must be positive and finite")


def _scalar(v: Any, name: str) -> float:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{name} must hold one value, not shape {a.shape}")
    f = float(a.reshape(-1)[0])
    if name.endswith("scale") and (not np.isfinite(f) or f <= 0):
        raise ValueError(f"{name} is {f}: it must be positive and finite")
    return f


def _zp(v: Any, name: str) -> float:
    return 0.0 if v is None else _scalar(v, name)


def _out_dtype(x: np.ndarray, y_zp: Any) -> np.dtype:
    dt = x.dtype if y_zp is None else np.asarray(y_zp).dtype
    if dt not in _EIGHT_BIT:
        raise TypeError(f"quantized tensors are uint8 or int8, not {dt}")
    return dt


def _quantize(v: np.ndarray, y_scale: float, y_zp: float, dt: np.dtype) -> np.ndarray:
    """saturate(rint(v / y_scale) + y_zp) in ``dt`` (float32 arithmetic, as onnxruntime)."""
    r = np.divide(v, _F32(y_scale), dtype=_F32)
    np.rint(r, out=r)
    r += _F32(y_zp)
    info = np.iinfo(dt)
    np.clip(r, info.min, info.max, out=r)
    return r.astype(dt)


def _codes(x: np.ndarray) -> np.ndarray:
    if x.dtype not in _EIGHT_BIT:
        raise TypeError(f"quantized tensors are uint8 or int8, not {x.dtype}")
    return x.astype(_F32)


def _saturate(r: np.ndarray, dt: np.dtype) -> np.ndarray:
    info = np.iinfo(dt)
    np.clip(r, info.min, info.max, out=r)
    np.rint(r, out=r)
    return r.astype(dt)


def _dequantize(x: np.ndarray, scale: float, zp: float) -> np.ndarray:
    if x.dtype not in _EIGHT_BIT:
        raise TypeError(f"quantized tensors are uint8 or int8, not {x.dtype}")
    r = x.astype(_F32)
    r -= _F32(zp)
    r *= _F32(scale)
    return r


def _binary(op: Any) -> Any:
    def build(ctx: KernelContext) -> ComputeFn:
        _check_scalars(ctx, (1, 2, 4, 5, 6, 7), (1, 4, 6))

        def qlinear_binary(
            a: np.ndarray, a_scale: Any, a_zp: Any, b: np.ndarray, b_scale: Any, b_zp: Any,
            c_scale: Any, c_zp: Any = None,
        ) -> np.ndarray:  # fmt: skip
            dt = _out_dtype(a, c_zp)
            sa, sb = _scalar(a_scale, "A_scale"), _scalar(b_scale, "B_scale")
            sc = _scalar(c_scale, "C_scale")
            za, zb = _zp(a_zp, "A_zero_point"), _zp(b_zp, "B_zero_point")
            ia, ib = _codes(a), _codes(b)
            if op is np.add:  # MLAS: the scale ratios in float32, the zero point before rounding
                r = (ia - _F32(za)) * _F32(_F32(sa) / _F32(sc))
                r = r + (ib - _F32(zb)) * _F32(_F32(sb) / _F32(sc))  # may broadcast r
            else:
                r = (ia - _F32(za)) * (ib - _F32(zb))
                r *= _F32(_F32(sa) * _F32(sb) / _F32(sc))
            r += _F32(_zp(c_zp, "C_zero_point"))
            return _saturate(r, dt)

        return qlinear_binary

    return build


def _unary_table(fn: Any) -> Any:
    """A unary op through a 256-entry table indexed by the input's bytes."""

    def build(ctx: KernelContext) -> ComputeFn:
        _check_scalars(ctx, (1, 2, 3, 4), (1, 3))
        alpha = float(ctx.attr("alpha", 0.01))

        def qlinear_unary(x: np.ndarray, x_scale: Any, x_zp: Any, y_scale: Any,
                          y_zp: Any = None) -> np.ndarray:  # fmt: skip
            dt = _out_dtype(x, y_zp)
            if x.dtype not in _EIGHT_BIT:
                raise TypeError(f"quantized tensors are uint8 or int8, not {x.dtype}")
            codes = np.arange(256, dtype=np.int64).astype(np.uint8).view(x.dtype)
            v = _dequantize(codes, _scalar(x_scale, "X_scale"), _zp(x_zp, "X_zero_point"))
            table = _quantize(fn(v, alpha), _scalar(y_scale, "Y_scale"),
                              _zp(y_zp, "Y_zero_point"), dt)  # fmt: skip
            return table.take(x.view(np.uint8).astype(np.intp))

        return qlinear_unary

    return build


def _sigmoid(v: np.ndarray, _alpha: float) -> np.ndarray:
    return np.reciprocal(_F32(1.0) + np.exp(-v, dtype=_F32), dtype=_F32)


def _leaky_relu(v: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(v >= 0, v, v * _F32(alpha)).astype(_F32)


def _global_average_pool(ctx: KernelContext) -> ComputeFn:
    """QLinearGlobalAveragePool(X, x_scale, x_zp, y_scale, y_zp): the mean over the spatial
    dims (NCHW..., or N...C with ``channels_last``), requantized."""
    _check_scalars(ctx, (1, 2, 3, 4), (1, 3))
    last = bool(int(ctx.attr("channels_last", 0)))

    def qlinear_global_average_pool(x: np.ndarray, x_scale: Any, x_zp: Any, y_scale: Any,
                                    y_zp: Any = None) -> np.ndarray:  # fmt: skip
        if x.ndim < 3:
            raise ValueError(f"QLinearGlobalAveragePool: input of rank {x.ndim}, not >= 3")
        dt = _out_dtype(x, y_zp)
        axes = tuple(range(1, x.ndim - 1)) if last else tuple(range(2, x.ndim))
        n = int(np.prod([x.shape[a] for a in axes]))
        zp = _zp(x_zp, "x_zero_point")
        acc = x.sum(axis=axes, keepdims=True, dtype=np.int64) - np.int64(round(zp)) * n
        scale = _scalar(x_scale, "x_scale") / (_scalar(y_scale, "y_scale") * max(n, 1))
        return requantize(acc, scale, None if y_zp is None else np.asarray(y_zp).reshape(()), dt)

    return qlinear_global_average_pool


def _concat(ctx: KernelContext) -> ComputeFn:
    """QLinearConcat(Y_scale, Y_zp, (X, X_scale, X_zp)...; axis): each input requantized to
    the output's scale and zero point, then concatenated."""
    axis = int(ctx.attr("axis"))

    def qlinear_concat(y_scale: Any, y_zp: Any, *rest: Any) -> np.ndarray:
        if not rest or len(rest) % 3:
            raise ValueError("QLinearConcat: inputs come as (X, X_scale, X_zero_point) triplets")
        ys, yz = _scalar(y_scale, "Y_scale"), _zp(y_zp, "Y_zero_point")
        dt = _out_dtype(rest[0], y_zp)
        parts = [
            _quantize(_dequantize(x, _scalar(s, "X_scale"), _zp(z, "X_zero_point")), ys, yz, dt)
            for x, s, z in zip(rest[0::3], rest[1::3], rest[2::3])
        ]
        return np.concatenate(parts, axis=axis)

    return qlinear_concat


def _qgemm(ctx: KernelContext) -> ComputeFn:
    """QGemm(A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp?; alpha, transA,
    transB): ``(A - a_zp) @ (B - b_zp) + C`` (int32 C, broadcast), times ``alpha * a_scale
    * b_scale`` (b's per output column), then requantized with y's scale and zero point,
    or float32 when there is no y zero point (divided by y_scale when one is given)."""
    _check_scalars(ctx, (1, 2, 7, 8), (1, 7))
    alpha = float(ctx.attr("alpha", 1.0))
    trans_a = bool(int(ctx.attr("transA", 0)))
    trans_b = bool(int(ctx.attr("transB", 0)))

    def qgemm(a: np.ndarray, a_scale: Any, a_zp: Any, b: np.ndarray, b_scale: Any, b_zp: Any,
              c: Any = None, y_scale: Any = None, y_zp: Any = None) -> np.ndarray:  # fmt: skip
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"QGemm: A and B must be matrices, not rank {a.ndim} and {b.ndim}")
        a2 = a.T if trans_a else a
        b2 = b.T if trans_b else b
        if a2.shape[1] != b2.shape[0]:
            raise ValueError(f"QGemm: A {a2.shape} and B {b2.shape} do not multiply")
        n = b2.shape[1]
        bs = np.asarray(b_scale, dtype=np.float64).reshape(-1)
        bz = None if b_zp is None else np.asarray(b_zp).reshape(-1)
        if bs.size not in (1, n) or (bz is not None and bz.size != bs.size):
            raise ValueError("QGemm: b's scale and zero point are one value or one per column")
        cdt = _cdt(a2.shape[1])
        acc = np.matmul(_a_side(a2, _zp(a_zp, "a_zero_point"), cdt), _b_side(b2, bz, cdt))
        if c is not None:
            acc = acc + np.asarray(c, dtype=np.int64)
        scale = alpha * _scalar(a_scale, "a_scale") * bs
        if y_zp is None:
            if y_scale is not None:
                scale = scale / _scalar(y_scale, "y_scale")
            return (acc.astype(np.float64) * scale).astype(_F32)
        scale = scale / _scalar(y_scale, "y_scale") if y_scale is not None else scale
        return requantize(acc, scale, np.asarray(y_zp).reshape(()), _out_dtype(a, y_zp))

    return qgemm


def register_kernels(registry: KernelRegistry) -> None:
    """Register the QOperator contrib ops."""
    registry.add("QLinearAdd", _binary(np.add), domain=MS_DOMAIN, since=1)
    registry.add("QLinearMul", _binary(np.multiply), domain=MS_DOMAIN, since=1)
    registry.add("QLinearSigmoid", _unary_table(_sigmoid), domain=MS_DOMAIN, since=1)
    registry.add("QLinearLeakyRelu", _unary_table(_leaky_relu), domain=MS_DOMAIN, since=1)
    registry.add(
        "QLinearGlobalAveragePool", _global_average_pool, domain=MS_DOMAIN, since=1
    )  # fmt: skip
    registry.add("QLinearConcat", _concat, domain=MS_DOMAIN, since=1)
    registry.add("QGemm", _qgemm, domain=MS_DOMAIN, since=1)
