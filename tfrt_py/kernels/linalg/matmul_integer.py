"""Kernels (linalg): integer and quantized matmuls (MatMulInteger, QLinearMatMul).

A constant 2-D B with a constant (or no) zero point is packed at load for the integer
kernel (``lib.qgemm_rows``: exact u8 x s8 sums in int32, VNNI where the CPU has it).
Otherwise, and where that kernel does not run, the 8-bit operands minus their zero points
are multiplied exactly on float BLAS: float32 when the reduction is short enough for every
partial sum to stay below 2**24 (K <= 258), else float64; a constant B (minus its constant
zero point) converted once at load.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..lib.qgemm_rows import IntegerWeights, integer_product_cost
from ..lib.quant import check_constants, requantize
from ..lib.quant import exact_dtype as _cdt
from ..lib.quant import minus_zero_point_cols as _b_side
from ..lib.quant import minus_zero_point_rows as _a_side
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _row(v: Any) -> np.ndarray:
    v = np.asarray(v)
    return v.reshape(-1, 1) if v.ndim == 1 and v.size > 1 else v


def _b_const(ctx: KernelContext, b_idx: int, zp_idx: int) -> tuple[np.ndarray | None, Any]:
    """(B - zp) converted at load when B and its zero point (or its absence) are constant."""
    b = ctx.const_input(b_idx)
    if b is None or b.ndim < 1:
        return None, None
    if ctx.has_input(zp_idx) and ctx.const_input(zp_idx) is None:
        return None, None
    k = b.shape[0] if b.ndim == 1 else b.shape[-2]
    cdt = _cdt(k)
    return _b_side(b, ctx.const_input(zp_idx), cdt), cdt


def _integer_weights(ctx: KernelContext, b_idx: int, zp_idx: int) -> IntegerWeights | None:
    """B packed for the integer kernel when it and its zero point (or its absence) are
    constants."""
    if ctx.has_input(zp_idx) and ctx.const_input(zp_idx) is None:
        return None
    return IntegerWeights.make(ctx.const_input(b_idx), ctx.const_input(zp_idx))


def _matmul_integer(ctx: KernelContext) -> ComputeFn:
    """MatMulInteger(A, B, a_zero_point?, b_zero_point?) -> int32 (A - azp) @ (B - bzp).

    a_zero_point is scalar or per row of A; b_zero_point scalar or per column of B."""
    bf_const, cdt_const = _b_const(ctx, 1, 3)
    packed = _integer_weights(ctx, 1, 3)

    def matmul_integer(a: np.ndarray, b: np.ndarray, a_zp: Any = None, b_zp: Any = None) -> Any:
        if packed is not None:
            acc = packed.product(a, a_zp)
            if acc is not None:
                return acc
        if bf_const is not None:
            cdt, bf = cdt_const, bf_const
        else:
            cdt = _cdt(a.shape[-1])
            bf = _b_side(b, b_zp, cdt)
        return np.matmul(_a_side(a, a_zp, cdt), bf).astype(np.int32)

    return matmul_integer


def _qlinear_matmul(ctx: KernelContext) -> ComputeFn:
    """QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) -> quantized y.

    y = saturate(round((a-azp) @ (b-bzp) * a_scale*b_scale/y_scale) + y_zp), rounding half
    to even; a's scale/zero point may be per row, b's per column."""
    for i in (0, 3, 7):
        dt = ctx.input_dtype(i)
        if dt is not None and np.dtype(dt).kind not in "iu":
            raise ctx.unsupported(
                f"input {i} of type {dt}: only the 8-bit integer types are supported"
            )
    b = ctx.const_input(3)
    n = 0 if b is None or b.ndim < 1 else int(b.shape[-1])
    a_rows = -1  # a's scale and zero point may be per row (their count is A's rows)
    check_constants(ctx, {1: a_rows, 4: n, 6: 0}, {2: a_rows, 5: n, 7: 0})
    bf_const, cdt_const = _b_const(ctx, 3, 5)
    packed = _integer_weights(ctx, 3, 5)

    def qlinear_matmul(
        a: np.ndarray,
        a_scale: np.ndarray,
        a_zp: Any,
        b: np.ndarray,
        b_scale: np.ndarray,
        b_zp: Any,
        y_scale: np.ndarray,
        y_zp: Any = None,
    ) -> np.ndarray:
        acc = None if packed is None or np.asarray(a_scale).size > 1 else packed.product(a, a_zp)
        if acc is None:
            if bf_const is not None:
                cdt, bf = cdt_const, bf_const
            else:
                cdt = _cdt(a.shape[-1])
                bf = _b_side(b, b_zp, cdt)
            acc = np.matmul(_a_side(a, a_zp, cdt), bf)
        scale = (_row(a_scale) * np.asarray(b_scale) / np.asarray(y_scale)).astype(np.float64)
        return requantize(acc, scale, y_zp, a.dtype)

    return qlinear_matmul


def register_kernels(registry: KernelRegistry) -> None:
    """Register MatMulInteger and QLinearMatMul."""
    registry.add("MatMulInteger", _matmul_integer, since=10, cost=integer_product_cost(1))
    registry.add("QLinearMatMul", _qlinear_matmul, since=10, cost=integer_product_cost(3))
