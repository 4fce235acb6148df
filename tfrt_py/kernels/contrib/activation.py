"""Kernels (contrib): the GELU family of the com.microsoft domain -- Gelu, BiasGelu,
FastGelu, QuickGelu -- and FusedMatMul.

* Gelu-1: ``x/2 (1 + erf(x / sqrt 2))`` (the exact form; ``erf`` from ``kernels/lib/erf.py``).
* BiasGelu-1: ``Gelu(A + B)``, B broadcast along A's last axis (onnxruntime's fusion of a
  MatMul bias into the activation).
* FastGelu-1: the tanh approximation ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` of
  ``X + bias`` (bias optional, broadcast along the last axis).
* QuickGelu-1: ``x * sigmoid(alpha x)``, alpha 1.702 by default (no overflow warning for
  large ``|x|``).
* FusedMatMul-1: ``alpha * op(A) @ op(B)`` with NumPy matmul broadcasting, where op applies
  ``transBatch*`` first (the leading axis moves to the place just before the last one: a
  ``[M, b1.., K]`` operand is read as ``[b1.., M, K]``) and then ``trans*`` (the last two
  axes swap). ``trans*`` is ignored for 1-D operands, as in onnxruntime; ``transBatch*``
  needs A and B of one rank >= 3 (onnxruntime's rule). onnxruntime 1.32 computes
  ``transA`` with a 1-D B as a reshape rather than a transpose (a bug); this kernel
  transposes, as the attribute says.

Outputs keep the input's dtype (float16 is computed in float32 and cast back: NumPy has no
fast float16 math). The activations take ``out=`` and may write into input 0's buffer:
each reads an element of its inputs before it writes that element of ``out``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import OUT, OUT_INPLACE, ComputeFn, Cost, KernelContext
from ..lib import activation_ir
from ..lib.gelu_jit import gelu_erf_f32
from ..lib.gelu_numpy import gelu_erf, gelu_tanh
from ..lib.sigmoid_jit import flat_f32, gelu_tanh_f32, in_place
from ..registry import KernelRegistry

__all__ = ["MS_DOMAIN", "register_kernels"]

#: onnxruntime's contrib-op domain.
MS_DOMAIN = "com.microsoft"


def _wide(fn: ComputeFn) -> ComputeFn:
    """``fn`` for float32/float64 inputs; other dtypes (float16, bfloat16) run through
    float32 and are cast back into ``out`` or a new array of the input's dtype."""

    def widened(x: np.ndarray, *rest: Any, out: np.ndarray | None = None) -> np.ndarray:
        if x.dtype.char in "fd":
            return fn(x, *rest, out=out)
        wide = [None if r is None else np.asarray(r, np.float32) for r in rest]
        r = fn(x.astype(np.float32), *wide, out=None)
        if out is None:
            return np.asarray(r).astype(x.dtype)
        np.copyto(out, r, casting="unsafe")
        return out

    return widened


def _gelu(ctx: KernelContext) -> ComputeFn:
    """Gelu-1 (com.microsoft): ``fn(X, out=None) -> X/2 (1 + erf(X / sqrt 2))`` (float32:
    the compiled one-pass loop of ``kernels/lib/gelu_jit`` when numba is there)."""
    fast = gelu_erf_f32()
    activation_ir.WANTED.set()  # a cold start's stand-in: one pass once the warm-up built it

    def gelu(X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if fast is not None and X.dtype == np.float32:
            y = fast(X, out)
            if y is not None:
                return y
        return gelu_erf(X, out)

    return _wide(gelu)


def _bias_gelu(ctx: KernelContext) -> ComputeFn:
    """BiasGelu-1: ``fn(A, B, out=None) -> Gelu(A + B)`` (B: 1-D, A's last axis; the GELU
    compiled for float32 as in Gelu)."""
    fast = gelu_erf_f32()
    activation_ir.WANTED.set()

    def bias_gelu(A: np.ndarray, B: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        x = np.add(A, B, out=out)  # out may alias A: each element is read, then written
        if fast is not None and x.dtype == np.float32:
            y = fast(x, x)
            if y is not None:
                return y
        return gelu_erf(x, x)

    return _wide(bias_gelu)


def _fast_gelu(ctx: KernelContext) -> ComputeFn:
    """FastGelu-1: ``fn(X, bias=None, out=None)``, the tanh GELU of ``X + bias`` (float32:
    one compiled pass, ``sigmoid_jit.gelu_tanh_f32``, when numba is there)."""
    fast = gelu_tanh_f32()

    def fast_gelu(
        X: np.ndarray, bias: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        if fast is not None and flat_f32(X, out):
            if bias is None:
                return in_place(fast, X, out)
            if bias.dtype == np.float32 and np.broadcast_shapes(X.shape, bias.shape) == X.shape:
                y = np.add(X, bias, out=out)  # out may alias X: read, then written
                fast(y.reshape(-1))
                return y
        if bias is None:
            return gelu_tanh(X, out)
        x = np.add(X, bias, out=out)
        return gelu_tanh(x, x)

    return _wide(fast_gelu)


def _quick_gelu(ctx: KernelContext) -> ComputeFn:
    """QuickGelu-1: ``fn(X, out=None) -> X * sigmoid(alpha X)``, with sigmoid as
    ``(1 + tanh(z/2)) / 2``: no exp to overflow for large ``|alpha X|``."""
    half_alpha = 0.5 * float(ctx.attr("alpha", 1.702))

    def quick_gelu(X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        t = np.multiply(X, half_alpha)
        np.tanh(t, out=t)
        t += 1.0
        t *= 0.5
        return np.multiply(X, t, out=out)

    return _wide(quick_gelu)


def _matmul_operand(x: np.ndarray, trans_batch: bool, trans: bool) -> np.ndarray:
    """The logical operand of FusedMatMul: ``[X, b.., Y]`` read as ``[b.., X, Y]`` when
    ``trans_batch`` (rank >= 3), then the last two axes swapped when ``trans`` (rank >= 2).
    Views only."""
    if x.ndim >= 3 and trans_batch:
        x = np.moveaxis(x, 0, -2)
    if x.ndim >= 2 and trans:
        x = x.swapaxes(-1, -2)
    return x


def _fused_mat_mul(ctx: KernelContext) -> ComputeFn:
    """FusedMatMul-1: ``fn(A, B, out=None) -> alpha * op(A) @ op(B)``."""
    alpha = float(ctx.attr("alpha", 1.0))
    trans_a = bool(ctx.attr("transA", 0))
    trans_b = bool(ctx.attr("transB", 0))
    batch_a = bool(ctx.attr("transBatchA", 0))
    batch_b = bool(ctx.attr("transBatchB", 0))
    const_b = ctx.const_input(1)
    if const_b is not None:  # a weight: its logical layout made contiguous once, at load
        const_b = np.ascontiguousarray(_matmul_operand(const_b, batch_b, trans_b))

    def fused_mat_mul(A: np.ndarray, B: np.ndarray, out: np.ndarray | None = None) -> Any:
        if (batch_a or batch_b) and (A.ndim != B.ndim or A.ndim < 3):
            raise ValueError("FusedMatMul: transBatch* needs A and B of one rank, at least 3")
        a = _matmul_operand(A, batch_a, trans_a)
        b = const_b if const_b is not None else _matmul_operand(B, batch_b, trans_b)
        wide = A.dtype.char not in "fd"
        if wide:
            a, b = a.astype(np.float32), b.astype(np.float32)
        if wide or out is None:
            y = np.matmul(a, b)
            if alpha != 1.0:
                y *= alpha
            if wide:
                y = y.astype(A.dtype)
            if out is None:
                return y
            np.copyto(out, y)
            return out
        np.matmul(a, b, out=out)
        if alpha != 1.0:
            out *= alpha
        return out

    return fused_mat_mul


def _fused_mat_mul_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    """2 * |Y| * K multiply-adds (K: A's contracted axis) and the bytes of A, B and Y."""
    a = ins[0] if ins else ()
    k = 1
    if a:
        k = a[-2] if (len(a) >= 2 and ctx.attr("transA", 0)) else a[-1]
    y = math.prod(outs[0]) if outs else 0
    moved = 4.0 * (sum(math.prod(s) for s in ins) + y)
    return Cost(2.0 * y * k, moved)


def register_kernels(registry: KernelRegistry) -> None:
    """Register Gelu, BiasGelu, FastGelu, QuickGelu and FusedMatMul (com.microsoft)."""
    registry.add("Gelu", _gelu, domain=MS_DOMAIN, since=1, flags=OUT_INPLACE)
    registry.add("BiasGelu", _bias_gelu, domain=MS_DOMAIN, since=1, flags=OUT_INPLACE)
    registry.add("FastGelu", _fast_gelu, domain=MS_DOMAIN, since=1, flags=OUT_INPLACE)
    registry.add("QuickGelu", _quick_gelu, domain=MS_DOMAIN, since=1, flags=OUT_INPLACE)
    registry.add(
        "FusedMatMul",
        _fused_mat_mul,
        domain=MS_DOMAIN,
        since=1,
        flags=OUT,
        cost=_fused_mat_mul_cost,
    )
