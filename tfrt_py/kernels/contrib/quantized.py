"""Kernels (contrib): onnxruntime's quantized operators in the QOperator format that
``onnxruntime.quantization.quantize_static`` writes -- QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearConcat, QGemm -- and the
MatMulIntegerToFloat / DynamicQuantizeMatMul that onnxruntime's optimizer makes of
``quantize_dynamic``'s products.

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

import math
from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..lib.qgemm_rows import IntegerWeights, integer_product_cost
from ..lib.quant import dynamic_quantize, requantize
from ..lib.quant import exact_dtype as _cdt
from ..lib.quant import minus_zero_point_cols as _b_side
from ..lib.quant import minus_zero_point_rows as _a_side
from ..registry import KernelRegistry
from .activation import MS_DOMAIN
from .quantized_elementwise import channel_means, compiled_binary, compiled_lookup

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


def dequantize(q: Any, scale: Any, zp: Any, what: str) -> np.ndarray:
    """``(q - zp) * scale`` in float32 for 8-bit ``q``; the scale (and zero point) one value
    or one per column; TypeError / ValueError naming ``what`` for another dtype or a scale
    that is not positive and finite. QAttention and QEmbedLayerNormalization use it too."""
    q = np.asarray(q)
    if q.dtype not in _EIGHT_BIT:
        raise TypeError(f"{what}: quantized values are uint8 or int8, not {q.dtype}")
    s = np.asarray(scale, _F32)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"{what}: a scale is not positive and finite")
    r = q.astype(_F32)
    if zp is not None:
        r -= np.asarray(zp).astype(_F32)
    r *= s
    return r


def _binary_params(add: bool, a_dtype: np.dtype, a_scale: Any, a_zp: Any, b_scale: Any,
                   b_zp: Any, c_scale: Any, c_zp: Any) -> tuple[np.dtype, np.ndarray]:  # fmt: skip
    """(output dtype, float32 [za, zb, r0, r1, zc, lo, hi]): ``compiled_binary``'s
    constants; the ratios in float32, as MLAS (add: sa/sc and sb/sc; mul: sa*sb/sc)."""
    dt = a_dtype if c_zp is None else np.asarray(c_zp).dtype
    if dt not in _EIGHT_BIT:
        raise TypeError(f"quantized tensors are uint8 or int8, not {dt}")
    sa, sb = _F32(_scalar(a_scale, "A_scale")), _F32(_scalar(b_scale, "B_scale"))
    sc = _F32(_scalar(c_scale, "C_scale"))
    r = (sa / sc, sb / sc) if add else (sa * sb / sc, _F32(0))
    info = np.iinfo(dt)
    za, zb = _zp(a_zp, "A_zero_point"), _zp(b_zp, "B_zero_point")
    zc = _zp(c_zp, "C_zero_point")
    return dt, np.array([za, zb, r[0], r[1], zc, info.min, info.max], _F32)


def _binary(op: Any) -> Any:
    add = op is np.add

    def build(ctx: KernelContext) -> ComputeFn:
        _check_scalars(ctx, (1, 2, 4, 5, 6, 7), (1, 4, 6))
        # constant scales and zero points (what the quantization tool writes): their
        # arithmetic once, at load, for the input type they imply
        consts = [ctx.const_input(i) for i in (1, 2, 4, 5, 6, 7)]
        fixed = None
        if all(c is not None for c in consts) and np.asarray(consts[1]).dtype in _EIGHT_BIT:
            fixed = _binary_params(add, np.asarray(consts[1]).dtype, *consts)

        def qlinear_binary(
            a: np.ndarray, a_scale: Any, a_zp: Any, b: np.ndarray, b_scale: Any, b_zp: Any,
            c_scale: Any, c_zp: Any = None,
        ) -> np.ndarray:  # fmt: skip
            if fixed is not None and a.dtype == fixed[0]:
                dt, params = fixed
            else:
                dt, params = _binary_params(add, a.dtype, a_scale, a_zp, b_scale, b_zp,
                                            c_scale, c_zp)  # fmt: skip
            y = compiled_binary(add, a, b, params, dt)
            if y is not None:
                return y
            za, zb, r0, r1, zc = (_F32(v) for v in params[:5])
            ia, ib = _codes(a), _codes(b)
            if add:
                r = (ia - za) * r0
                r = r + (ib - zb) * r1  # may broadcast r
            else:
                r = (ia - za) * (ib - zb)
                r *= r0
            r += zc
            return _saturate(r, dt)

        return qlinear_binary

    return build


def _make_table(fn: Any, alpha: float, dt_in: np.dtype, x_scale: Any, x_zp: Any,
                y_scale: Any, y_zp: Any) -> np.ndarray:  # fmt: skip
    """The 256 output codes of unary ``fn`` for the input codes in byte order."""
    dt = _out_dtype(np.empty(0, dt_in), y_zp)
    codes = np.arange(256, dtype=np.int64).astype(np.uint8).view(dt_in)
    v = dequantize(codes, _scalar(x_scale, "X_scale"), _zp(x_zp, "X_zero_point"), "X")
    return _quantize(fn(v, alpha), _scalar(y_scale, "Y_scale"), _zp(y_zp, "Y_zero_point"), dt)


def _unary_table(fn: Any) -> Any:
    """A unary op through a 256-entry table indexed by the input's bytes."""

    def build(ctx: KernelContext) -> ComputeFn:
        _check_scalars(ctx, (1, 2, 3, 4), (1, 3))
        alpha = float(ctx.attr("alpha", 0.01))
        # constant scales and zero points (what the quantization tool writes): the table
        # is made once, at load, for the input type they imply
        consts = [ctx.const_input(i) for i in (1, 2, 3, 4)]
        fixed = None
        if all(c is not None for c in consts):
            dt_in = np.asarray(consts[1]).dtype
            if dt_in in _EIGHT_BIT:
                fixed = (dt_in, _make_table(fn, alpha, dt_in, *consts))

        def qlinear_unary(x: np.ndarray, x_scale: Any, x_zp: Any, y_scale: Any,
                          y_zp: Any = None) -> np.ndarray:  # fmt: skip
            if x.dtype not in _EIGHT_BIT:
                raise TypeError(f"quantized tensors are uint8 or int8, not {x.dtype}")
            if fixed is not None and fixed[0] == x.dtype:
                table = fixed[1]
            else:
                table = _make_table(fn, alpha, x.dtype, x_scale, x_zp, y_scale, y_zp)
            y = compiled_lookup(x, table)
            return y if y is not None else table.take(x.view(np.uint8).astype(np.intp))

        return qlinear_unary

    return build


def unary_times_input_table(op: str, alpha: float, unary: list[Any], mul: list[Any],
                            x_first: bool) -> np.ndarray | None:  # fmt: skip
    """The 256 codes of ``QLinearMul(x, op(x))`` (``x_first``; else ``QLinearMul(op(x),
    x)``) for the input codes in byte order: the unary's table (``op`` QLinearSigmoid or
    QLinearLeakyRelu; ``unary`` its constant X_scale, X_zp, Y_scale, Y_zp), then the
    product's float32 steps on each pair of codes (``mul``: A_scale, A_zp, B_scale, B_zp,
    C_scale, C_zp): the codes the two kernels give, as one lookup (``fused::QTable``).
    None for another op or for codes that are not 8-bit."""
    fn = {"QLinearSigmoid": _sigmoid, "QLinearLeakyRelu": _leaky_relu}.get(op)
    dt_in = np.asarray(unary[1]).dtype
    if fn is None or dt_in not in _EIGHT_BIT:
        return None
    x = np.arange(256, dtype=np.int64).astype(np.uint8).view(dt_in)
    fx = _make_table(fn, alpha, dt_in, *unary)
    a, b = (x, fx) if x_first else (fx, x)
    if np.asarray(mul[1]).dtype != a.dtype or np.asarray(mul[3]).dtype != b.dtype:
        return None
    dt, params = _binary_params(False, a.dtype, *mul)
    za, zb, r0, _, zc = (_F32(v) for v in params[:5])
    r = (_codes(a) - za) * (_codes(b) - zb)
    r *= r0
    r += zc
    return _saturate(r, dt)


def _sigmoid(v: np.ndarray, _alpha: float) -> np.ndarray:
    return np.reciprocal(_F32(1.0) + np.exp(-v, dtype=_F32), dtype=_F32)


def _leaky_relu(v: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(v >= 0, v, v * _F32(alpha)).astype(_F32)


def _global_average_pool(ctx: KernelContext) -> ComputeFn:
    """QLinearGlobalAveragePool(X, x_scale, x_zp, y_scale, y_zp): the mean over the spatial
    dims (NCHW..., or N...C with ``channels_last``), requantized: ``saturate(rint(float32(
    sum - x_zp * P) * float32(x_scale / (y_scale * P))) + y_zp)``."""
    _check_scalars(ctx, (1, 2, 3, 4), (1, 3))
    last = bool(int(ctx.attr("channels_last", 0)))

    def qlinear_global_average_pool(x: np.ndarray, x_scale: Any, x_zp: Any, y_scale: Any,
                                    y_zp: Any = None) -> np.ndarray:  # fmt: skip
        if x.ndim < 3:
            raise ValueError(f"QLinearGlobalAveragePool: input of rank {x.ndim}, not >= 3")
        dt = _out_dtype(x, y_zp)
        axes = tuple(range(1, x.ndim - 1)) if last else tuple(range(2, x.ndim))
        n = math.prod([x.shape[a] for a in axes])
        zp = round(_zp(x_zp, "x_zero_point"))
        scale = _scalar(x_scale, "x_scale") / (_scalar(y_scale, "y_scale") * max(n, 1))
        yz = None if y_zp is None else np.asarray(y_zp).reshape(())
        y = channel_means(x, last, zp, scale, 0.0 if yz is None else float(yz), dt)
        if y is not None:
            return y
        acc = x.sum(axis=axes, keepdims=True, dtype=np.int64) - np.int64(zp) * n
        return requantize(acc, scale, yz, dt)

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
            _quantize(dequantize(x, _scalar(s, "X_scale"), _zp(z, "X_zero_point"), "X"), ys, yz, dt)
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
    packed = _integer_weights(ctx, 3, 5, trans_b)

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
        acc = _product(a2, a_zp, b2, bz, packed)
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


# -- MatMulIntegerToFloat, DynamicQuantizeMatMul -------------------------------------------


def _integer_weights(ctx: KernelContext, b_idx: int, zp_idx: int,
                     trans: bool = False) -> IntegerWeights | None:  # fmt: skip
    """B (transposed when ``trans``) packed for the integer kernel when it and its zero
    point (or its absence) are constants."""
    b = ctx.const_input(b_idx)
    if b is None or (ctx.has_input(zp_idx) and ctx.const_input(zp_idx) is None):
        return None
    zp = ctx.const_input(zp_idx)
    if zp is not None and zp.ndim > 1:
        return None
    return IntegerWeights.make(b.T if trans and b.ndim == 2 else b, zp)


def _product(a: np.ndarray, a_zp: Any, b: np.ndarray, bz: Any,
             packed: IntegerWeights | None) -> np.ndarray:  # fmt: skip
    """The exact ``(A - a_zp) @ (B - bz)``: on the integer kernel over B packed at load,
    else on float BLAS."""
    zp = _zp(a_zp, "a_zero_point")
    if packed is not None:
        acc = packed.product(a, None if a_zp is None else np.asarray(a_zp).reshape(()))
        if acc is not None:
            return acc
    cdt = _cdt(b.shape[0])
    return np.matmul(_a_side(a, zp, cdt), _b_side(b, bz, cdt))


def _integer_to_float(a: np.ndarray, b: np.ndarray, a_scale: Any, b_scale: Any, a_zp: Any,
                      b_zp: Any, bias: Any,
                      packed: IntegerWeights | None = None) -> np.ndarray:  # fmt: skip
    """``(A - a_zp) @ (B - b_zp)`` exactly, times ``a_scale * b_scale`` (b's per column) in
    float32, plus bias: onnxruntime's order (the scales' product first)."""
    for x, what in ((a, "A"), (b, "B")):
        if x.dtype not in _EIGHT_BIT:
            raise TypeError(f"{what} must be uint8 or int8, not {x.dtype}")
    if b.ndim != 2 or a.ndim < 1 or a.shape[-1] != b.shape[0]:
        raise ValueError(f"A {a.shape} and B {b.shape} do not multiply")
    n = b.shape[1]
    bs = np.asarray(b_scale, _F32).reshape(-1)
    if bs.size not in (1, n) or not np.all(np.isfinite(bs)):
        raise ValueError("b_scale must be one finite value or one per column")
    bz = None if b_zp is None else np.asarray(b_zp).reshape(-1)
    acc = _product(a, a_zp, b, bz, packed)
    y = acc.astype(_F32)  # then in place: one float32 array a call
    y *= _F32(_scalar(a_scale, "a_scale")) * bs
    if bias is not None:
        y += np.asarray(bias, _F32)
    return y


def _scaled_constants(ctx: KernelContext, packed: IntegerWeights | None, n: int,
                      scale_idx: int, bias_idx: int) -> tuple[np.ndarray, Any] | None:  # fmt: skip
    """B's scale (one per column, float32) and the bias (or None) made at load for
    ``product_scaled``, padded to the kernel's columns, when both are constants of the
    right size (else None)."""
    bs = ctx.const_input(scale_idx)
    bias = ctx.const_input(bias_idx) if ctx.has_input(bias_idx) else None
    if packed is None or bs is None or (ctx.has_input(bias_idx) and bias is None):
        return None
    bs = np.asarray(bs, _F32).reshape(-1)
    if bs.size not in (1, n) or not np.all(np.isfinite(bs)):
        return None
    if bias is not None and np.asarray(bias).shape != (n,):
        return None
    bias = None if bias is None else packed.padded(np.asarray(bias, _F32))
    return packed.padded(np.broadcast_to(bs, (n,))), bias


def _scaled(
    packed: IntegerWeights | None,
    fixed: tuple[np.ndarray, Any] | None,
    a: np.ndarray,
    a_scale: Any,
    a_zp: Any,
) -> np.ndarray | None:
    """``product_scaled`` with the constants made at load (``_scaled_constants``), or None
    (the caller's ``_integer_to_float``)."""
    if packed is None or fixed is None:
        return None
    return packed.product_scaled(a, a_zp, fixed[0], fixed[1], _F32(_scalar(a_scale, "a_scale")))


def _matmul_integer_to_float(ctx: KernelContext) -> ComputeFn:
    """MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zp?, b_zp?, bias?) -> float32. With
    B, its scale and zero point and the bias constants (what ``fuse_dynamic_quant`` and
    onnxruntime's optimizer make), one ``product_scaled`` call: the scaling as the kernel
    stores."""
    _check_scalars(ctx, (2, 4), (2,))
    packed = _integer_weights(ctx, 1, 5)
    b = ctx.const_input(1)
    fixed = None if b is None or b.ndim != 2 else _scaled_constants(ctx, packed, b.shape[1], 3, 6)

    def matmul_integer_to_float(a: np.ndarray, b: np.ndarray, a_scale: Any, b_scale: Any,
                                a_zp: Any = None, b_zp: Any = None,
                                bias: Any = None) -> np.ndarray:  # fmt: skip
        y = _scaled(packed, fixed, a, a_scale, a_zp)
        if y is not None:
            return y
        return _integer_to_float(a, b, a_scale, b_scale, a_zp, b_zp, bias, packed)

    return matmul_integer_to_float


def _dynamic_quantize_matmul(ctx: KernelContext) -> ComputeFn:
    """DynamicQuantizeMatMul(A float, B, b_scale, b_zp?, bias?): A quantized to uint8 as
    DynamicQuantizeLinear does (its range widened to hold 0), then MatMulIntegerToFloat."""
    packed = _integer_weights(ctx, 1, 3)
    b = ctx.const_input(1)
    fixed = None if b is None or b.ndim != 2 else _scaled_constants(ctx, packed, b.shape[1], 2, 4)

    def dynamic_quantize_matmul(a: np.ndarray, b: np.ndarray, b_scale: Any, b_zp: Any = None,
                                bias: Any = None) -> np.ndarray:  # fmt: skip
        if a.dtype != _F32:
            raise TypeError(f"A must be float32, not {a.dtype}")
        q, scale, zp = dynamic_quantize(a)
        y = _scaled(packed, fixed, q, scale, zp)
        if y is not None:
            return y
        return _integer_to_float(q, b, scale, b_scale, zp, b_zp, bias, packed)

    return dynamic_quantize_matmul


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
    registry.add("QGemm", _qgemm, domain=MS_DOMAIN, since=1, cost=integer_product_cost(3))
    registry.add("MatMulIntegerToFloat", _matmul_integer_to_float, domain=MS_DOMAIN, since=1,
                 cost=integer_product_cost(1))  # fmt: skip
    registry.add("DynamicQuantizeMatMul", _dynamic_quantize_matmul, domain=MS_DOMAIN, since=1,
                 cost=integer_product_cost(1))  # fmt: skip
