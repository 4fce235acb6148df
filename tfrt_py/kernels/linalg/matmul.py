"""Kernels (linalg): MatMul, Gemm, Det (Einsum is in ``einsum``, the integer and quantized
matmuls in ``matmul_integer``, QuantizeLinear and friends in ``quantize``).

MatMul and Gemm run on BLAS through ``np.matmul`` with ``out=`` (stacks of matrices of
one batch shape split over native threads: ``gemm.matmul_batched_into``). Gemm decides transA/transB
at load and, when B and C are constants, stores B transposed and scaled by alpha and C
scaled by beta, so a call is one matmul plus one in-place add. A stacked MatMul whose
right side is a matrix runs as a single 2-D matmul.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import OUT, ComputeFn, Cost, KernelContext
from ..common import compute_dtype
from ..lib.gemm import matmul_batched_into, matmul_into
from ..registry import KernelRegistry

__all__ = ["register_kernels"]

_BLAS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64))


def _matmul(ctx: KernelContext) -> ComputeFn:
    """MatMul(A, B) -> A @ B with NumPy matmul semantics (1-D promotion, batch broadcast).

    float16 multiplies in float32 (NumPy has no float16 BLAS) and rounds back once."""
    b_const = ctx.const_input(1)
    dt = ctx.input_dtype(0)
    if dt is None and b_const is not None:
        dt = b_const.dtype
    if dt is not None and compute_dtype(np.dtype(dt)) != dt:
        ndt = np.dtype(dt)
        b16 = None if b_const is None else b_const.astype(np.float32)

        def matmul_f16(a: np.ndarray, b: np.ndarray, out: Any = None) -> np.ndarray:
            bb = b16 if b16 is not None else b.astype(np.float32)
            r = np.matmul(a.astype(np.float32), bb)
            if out is None:
                return r.astype(ndt)
            out[...] = r
            return out

        return matmul_f16
    if b_const is not None and b_const.ndim == 2:
        bc = np.ascontiguousarray(b_const)
        k, n = bc.shape

        def matmul_const(a: np.ndarray, b: np.ndarray, out: Any = None) -> np.ndarray:
            if a.ndim == 2 and (out is None or out.flags.c_contiguous):
                return matmul_into(a, bc, out)
            if a.ndim > 2 and a.flags.c_contiguous:
                # one (rows, K) @ (K, N) gemm instead of a loop over the batch
                if out is None:
                    return matmul_into(a.reshape(-1, k), bc).reshape(*a.shape[:-1], n)
                if out.flags.c_contiguous:
                    matmul_into(a.reshape(-1, k), bc, out.reshape(-1, n))
                    return out
            return np.matmul(a, bc, out=out)

        return matmul_const

    def matmul(a: np.ndarray, b: np.ndarray, out: Any = None) -> np.ndarray:
        if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous and out is None:
            return np.matmul(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[1])
        if a.ndim > 2:  # stacks (attention's heads): row blocks on native threads
            return matmul_batched_into(a, b, out)
        return np.matmul(a, b, out=out)

    return matmul


def _matmul_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    if len(ins) < 2 or not outs or not ins[0]:
        return Cost(0.0, 0.0)
    k = ins[0][-1]
    y = float(np.prod(outs[0]))
    return Cost(2.0 * y * k, 4.0 * (float(np.prod(ins[0])) + float(np.prod(ins[1])) + y))


def _gemm_b(b_const: Any, dt: np.dtype | None, alpha: float, trans_b: bool) -> np.ndarray | None:
    """Gemm's constant B' (transposed when transB) with alpha folded in, for a BLAS dtype;
    None otherwise (B and alpha then apply per call)."""
    if b_const is None or dt is None or dt not in _BLAS:
        return None
    # Keep the layout the model stores B in (a transposed view when transB=1): every
    # output column is then the same dot product BLAS computes for onnxruntime, so equal
    # weight rows give bit-equal outputs. Re-laying out [out,in] weights as [in,out]
    # changes the summation order per column (a few ulp), which softmax over huge
    # logits turns into visibly different probabilities (the classic light CNNs).
    b_arr = np.ascontiguousarray(b_const, dtype=dt)
    if alpha != 1.0:
        b_arr = (b_arr * alpha).astype(dt)
    return b_arr.T if trans_b else b_arr


def _gemm(ctx: KernelContext) -> ComputeFn:
    """Gemm(A, B, C?) -> alpha * A' @ B' + beta * C (A' = A.T if transA, B' = B.T if transB).

    C broadcasts unidirectionally to (M, N). Opset < 7's ``broadcast`` attribute is
    accepted (NumPy broadcasting covers both settings)."""
    alpha = float(ctx.attr("alpha", 1.0))
    beta = float(ctx.attr("beta", 1.0))
    trans_a = bool(ctx.attr("transA", 0))
    trans_b = bool(ctx.attr("transB", 0))
    b_const = ctx.const_input(1)
    c_const = ctx.const_input(2)
    has_c = ctx.has_input(2) and beta != 0.0
    dt = ctx.input_dtype(0)
    if dt is None and b_const is not None:
        dt = b_const.dtype
    dt = None if dt is None else np.dtype(dt)
    bt = _gemm_b(b_const, dt, alpha, trans_b)  # B', alpha folded in
    ct: np.ndarray | None = None  # beta * C
    if has_c and c_const is not None and dt is not None and dt.kind in "fc":
        ct = (c_const * beta).astype(dt) if beta != 1.0 else c_const.astype(dt)
    scale_alpha = alpha != 1.0 and bt is None

    if bt is not None and ct is not None and not scale_alpha:
        bt_, ct_ = bt, ct

        def gemm_const(a: np.ndarray, b: Any, c: Any = None, out: Any = None) -> np.ndarray:
            y = np.matmul(a.T if trans_a else a, bt_, out=out)
            y += ct_
            return y

        return gemm_const
    if bt is not None and not has_c and not scale_alpha:
        bt_ = bt

        def gemm_const_noc(a: np.ndarray, b: Any, c: Any = None, out: Any = None) -> np.ndarray:
            return np.matmul(a.T if trans_a else a, bt_, out=out)

        return gemm_const_noc
    f16 = dt is not None and compute_dtype(dt) != dt

    def gemm(a: np.ndarray, b: np.ndarray, c: Any = None, out: Any = None) -> np.ndarray:
        if trans_a:
            a = a.T
        bb = bt if bt is not None else (b.T if trans_b else b)
        if f16:
            y = np.matmul(a.astype(np.float32), bb.astype(np.float32))
        else:
            y = np.matmul(a, bb, out=out if out is not None and out.dtype == a.dtype else None)
        if scale_alpha:
            if y.dtype.kind in "fc":
                y *= alpha
            else:
                y = (y * alpha).astype(y.dtype)
        if has_c and c is not None:
            if ct is not None:
                y += ct
            elif beta == 1.0:
                y += c
            elif y.dtype.kind in "fc":
                y += beta * c
            else:
                y += (beta * c).astype(y.dtype)
        if f16:
            y = y.astype(dt)
        if out is not None and y is not out:
            out[...] = y
            return out
        return y

    return gemm


def _gemm_cost(ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> Cost:
    if len(ins) < 2 or not outs or len(ins[0]) != 2:
        return Cost(0.0, 0.0)
    k = ins[0][0] if ctx.attr("transA", 0) else ins[0][1]
    y = float(np.prod(outs[0]))
    return Cost(2.0 * y * k, 4.0 * (float(np.prod(ins[0])) + float(np.prod(ins[1])) + y))


def _det(ctx: KernelContext) -> ComputeFn:
    """Det(X) -> determinant over the last two axes (float16 computes in float32)."""

    def det(x: np.ndarray) -> np.ndarray:
        if x.dtype in _BLAS:
            return np.asarray(np.linalg.det(x))
        return np.asarray(np.linalg.det(x.astype(np.float64))).astype(x.dtype)

    return det


def register_kernels(registry: KernelRegistry) -> None:
    """Register MatMul, Gemm and Det."""
    registry.add("MatMul", _matmul, since=1, flags=OUT, cost=_matmul_cost)
    registry.add("Gemm", _gemm, since=1, flags=OUT, cost=_gemm_cost)
    registry.add("Det", _det, since=11)
