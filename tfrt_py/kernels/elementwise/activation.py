"""Kernels (elementwise): activations -- Relu, LeakyRelu, Elu, Selu, Celu, Sigmoid,
HardSigmoid, HardSwish, Softplus, Softsign, Mish, ThresholdedRelu, Shrink, Gelu, Swish, PRelu.

Every compute function is ``fn(x, out=None)`` (PRelu: ``fn(x, slope, out=None)``) and
returns x's dtype. Attribute constants are Python floats, which NumPy treats as weak
scalars, so float16/float32/float64 inputs keep their dtype with no per-call casts.
Other float types (bfloat16 from ml_dtypes) and the integer types Shrink accepts are
computed in float32/float64 and cast back; when the input dtype is known at load to be a
native float the compute function skips that dtype check.

``out`` may alias ``x`` (these kernels are registered ``inplace``): each one reads what
it needs of ``x`` before it first writes ``out``, or reads and writes the same element in
one ufunc call.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..base import OUT_INPLACE, ComputeFn, KernelContext
from ..lib import activation_ir
from ..lib.activations import ACTIVATIONS, Epilogue, _act_row, _params
from ..lib.gelu_jit import gelu_erf_f32
from ..lib.gelu_numpy import gelu_erf, gelu_tanh
from ..lib.jit import Jitted
from ..lib.sigmoid_jit import flat_f32, gelu_tanh_f32, in_place, sigmoid_f32
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _bind_flag(
    loop: Callable[[np.ndarray, bool], None], silu: bool
) -> Callable[[np.ndarray], None]:
    """``sigmoid_f32``'s loop as ``fn(flat)`` for ``in_place`` (bound once, at load)."""

    def run(y: np.ndarray) -> None:
        loop(y, silu)

    return run


def _native_float(ctx: KernelContext, fast: ComputeFn) -> ComputeFn:
    """``fast`` when input 0 is statically a NumPy float; else a wrapper that runs other
    dtypes (bfloat16, integers) through float32/float64 and casts back."""
    dt = ctx.input_dtype(0)
    if dt is not None and dt.kind == "f":
        return fast

    def generic(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.dtype.kind == "f":
            return fast(x, out)
        wide = np.float64 if x.dtype.kind in "iub" else np.float32
        r = np.asarray(fast(x.astype(wide))).astype(x.dtype)
        if out is None:
            return r
        np.copyto(out, r)
        return out

    return generic


def _relu(ctx: KernelContext) -> ComputeFn:
    """Relu(x) = max(x, 0), any numeric type."""

    def relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.maximum(x, 0, out=out)

    return relu


def _leaky_relu(ctx: KernelContext) -> ComputeFn:
    """LeakyRelu(x) = x if x >= 0 else alpha * x; as max(x, alpha x) for alpha <= 1 and
    min(x, alpha x) otherwise."""
    alpha = float(ctx.attr("alpha", 0.01))
    pick = np.maximum if alpha <= 1.0 else np.minimum

    def leaky_relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        t = np.asarray(np.multiply(x, alpha))
        return pick(x, t, out=t if out is None else out)

    return _native_float(ctx, leaky_relu)


def _elu_like(alpha: float, gamma: float, inv_alpha: float | None) -> ComputeFn:
    """gamma * (max(x, 0) + alpha * expm1(min(x, 0) [* inv_alpha])): Elu, Selu, Celu."""

    def elu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        t = np.asarray(np.minimum(x, 0))
        if inv_alpha is not None:
            t *= inv_alpha
        np.expm1(t, out=t)
        t *= alpha
        r = np.asarray(np.maximum(x, 0, out=out))
        r += t
        if gamma != 1.0:
            r *= gamma
        return r

    return elu


def _elu(ctx: KernelContext) -> ComputeFn:
    """Elu(x) = x if x > 0 else alpha * (exp(x) - 1)."""
    return _native_float(ctx, _elu_like(float(ctx.attr("alpha", 1.0)), 1.0, None))


def _selu(ctx: KernelContext) -> ComputeFn:
    """Selu(x) = gamma * (x if x > 0 else alpha * (exp(x) - 1))."""
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    return _native_float(ctx, _elu_like(alpha, gamma, None))


def _celu(ctx: KernelContext) -> ComputeFn:
    """Celu(x) = max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha == 0.0:
        raise ctx.unsupported("alpha must be nonzero")
    return _native_float(ctx, _elu_like(alpha, 1.0, 1.0 / alpha))


def _sigmoid(ctx: KernelContext) -> ComputeFn:
    """Sigmoid(x) = 1 / (1 + exp(-x))."""

    loop = sigmoid_f32()  # compiled float32 loop with a vectorized exp, when numba is there
    fast = None if loop is None else _bind_flag(loop, False)
    activation_ir.WANTED.set()  # a cold start's stand-in: one pass once the warm-up built it

    def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if fast is not None and flat_f32(x, out):
            return in_place(fast, x, out)
        y = activation_ir.logistic(x, out, False)
        if y is not None:
            return y
        r = np.asarray(np.negative(x, out=out))
        np.exp(r, out=r)
        r += 1
        return np.reciprocal(r, out=r)

    return _native_float(ctx, sigmoid)


def _act_flat(y: np.ndarray, act: int, p: np.ndarray) -> None:  # pragma: no cover - numba
    """``activations._act_row``'s activation ``act`` over ``y`` in place (no bias: -0.0)."""
    _act_row(y, -p[2], act, p)


def _warm_act_flat(fn: Callable[..., None]) -> None:
    fn(np.zeros(3, np.float32), 3, _params(Epilogue("HardSwish"), np.dtype(np.float32)))


#: One pass for HardSwish and HardSigmoid over a contiguous float32 tensor (NumPy's four:
#: LeViT's 22 HardSwish nodes took 0.87 ms of a 13.8 ms call on one Zen 4 thread). No
#: fast-math: the multiplies and adds round as NumPy's, so the values are its bits.
ACT_FLAT = Jitted(_act_flat, _warm_act_flat, helpers=(_act_row,))


def _compiled_act(name: str, alpha: float, beta: float) -> Callable[[np.ndarray], None] | None:
    """``fn(flat)`` applying ``name`` in place with ``ACT_FLAT`` (bound once, at load), or
    None without numba."""
    loop = ACT_FLAT.get()
    if loop is None:
        return None
    code, params = ACTIVATIONS[name], _params(Epilogue(name, alpha, beta), np.dtype(np.float32))

    def run(y: np.ndarray) -> None:
        loop(y, code, params)

    return run


def _hard_sigmoid(ctx: KernelContext) -> ComputeFn:
    """HardSigmoid(x) = max(0, min(1, alpha * x + beta))."""
    alpha = float(ctx.attr("alpha", 0.2))
    beta = float(ctx.attr("beta", 0.5))
    fast = _compiled_act("HardSigmoid", alpha, beta)

    def hard_sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if fast is not None and flat_f32(x, out):
            return in_place(fast, x, out)
        r = np.asarray(np.multiply(x, alpha, out=out))
        r += beta
        np.maximum(r, 0, out=r)
        return np.minimum(r, 1, out=r)

    return _native_float(ctx, hard_sigmoid)


def _hard_swish(ctx: KernelContext) -> ComputeFn:
    """HardSwish(x) = x * max(0, min(1, x / 6 + 1/2))."""
    sixth = 1.0 / 6.0
    fast = _compiled_act("HardSwish", 0.0, 0.0)

    def hard_swish(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if fast is not None and flat_f32(x, out):
            return in_place(fast, x, out)
        t = np.asarray(np.multiply(x, sixth))
        t += 0.5
        np.maximum(t, 0, out=t)
        np.minimum(t, 1, out=t)
        return np.multiply(x, t, out=t if out is None else out)

    return _native_float(ctx, hard_swish)


def _softplus(ctx: KernelContext) -> ComputeFn:
    """Softplus(x) = log(exp(x) + 1), computed stably as logaddexp(x, 0)."""

    def softplus(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.logaddexp(x, 0, out=out)

    return _native_float(ctx, softplus)


def _softsign(ctx: KernelContext) -> ComputeFn:
    """Softsign(x) = x / (1 + |x|)."""

    def softsign(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        t = np.asarray(np.absolute(x))
        t += 1
        return np.divide(x, t, out=t if out is None else out)

    return _native_float(ctx, softsign)


def _mish(ctx: KernelContext) -> ComputeFn:
    """Mish(x) = x * tanh(softplus(x))."""

    def mish(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        t = np.asarray(np.logaddexp(x, 0))
        np.tanh(t, out=t)
        return np.multiply(x, t, out=t if out is None else out)

    return _native_float(ctx, mish)


def _thresholded_relu(ctx: KernelContext) -> ComputeFn:
    """ThresholdedRelu(x) = x if x > alpha else 0."""
    alpha = float(ctx.attr("alpha", 1.0))

    def thresholded_relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        keep = np.asarray(np.greater(x, alpha))
        if out is None:
            return np.where(keep, x, 0)
        if out is not x:
            np.copyto(out, x)
        np.copyto(out, 0, where=np.logical_not(keep, out=keep))
        return out

    return _native_float(ctx, thresholded_relu)


def _shrink(ctx: KernelContext) -> ComputeFn:
    """Shrink(x) = x - bias if x > lambd; x + bias if x < -lambd; else 0. Integer inputs
    are computed in float64 and cast back."""
    bias = float(ctx.attr("bias", 0.0))
    lambd = float(ctx.attr("lambd", 0.5))

    def shrink(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        hi = np.asarray(np.greater(x, lambd))
        lo = np.asarray(np.less(x, -lambd))
        r = np.empty_like(x) if out is None else out
        mid = np.asarray(np.logical_or(hi, lo))
        np.logical_not(mid, out=mid)
        np.subtract(x, bias, out=r, where=hi)
        np.add(x, bias, out=r, where=lo)
        np.copyto(r, 0, where=mid)
        return r

    return _native_float(ctx, shrink)


def _gelu(ctx: KernelContext) -> ComputeFn:
    """Gelu(x) = x/2 (1 + erf(x / sqrt 2)); approximate="tanh":
    x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    approximate = ctx.attr("approximate", "none")
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    if approximate == "none":
        fast = gelu_erf_f32()  # one compiled pass for float32, when numba is there
        activation_ir.WANTED.set()  # a cold start's stand-in: one pass once the warm-up built it

        def gelu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            if fast is not None and x.dtype == np.float32:
                y = fast(x, out)
                if y is not None:
                    return y
            return gelu_erf(x, out)

    elif approximate == "tanh":
        fast_tanh = gelu_tanh_f32()  # one compiled pass for float32, when numba is there

        def gelu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            if fast_tanh is not None and flat_f32(x, out):
                return in_place(fast_tanh, x, out)
            return gelu_tanh(x, out)

    else:
        raise ctx.unsupported(f"approximate={approximate!r}")
    return _native_float(ctx, gelu)


def _swish(ctx: KernelContext) -> ComputeFn:
    """Swish(x) = x * sigmoid(alpha * x) = x / (1 + exp(-alpha x))."""
    neg_alpha = -float(ctx.attr("alpha", 1.0))
    loop = sigmoid_f32() if neg_alpha == -1.0 else None  # SiLU: the compiled loop
    fast = None if loop is None else _bind_flag(loop, True)
    silu = neg_alpha == -1.0  # the IR kernel's SiLU serves it (a stand-in's, once built)
    if silu:
        activation_ir.WANTED.set()

    def swish(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if fast is not None and flat_f32(x, out):
            return in_place(fast, x, out)
        y = activation_ir.logistic(x, out, True) if silu else None
        if y is not None:
            return y
        t = np.asarray(np.multiply(x, neg_alpha))
        np.exp(t, out=t)
        t += 1
        return np.divide(x, t, out=t if out is None else out)

    return _native_float(ctx, swish)


def _prelu(ctx: KernelContext) -> ComputeFn:
    """PRelu(x, slope) = x if x >= 0 else slope * x; slope broadcasts to x's shape."""

    def prelu(x: np.ndarray, slope: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        neg = np.asarray(np.less(x, 0))
        if out is None:
            out = np.array(x, copy=True)
        elif out is not x:
            np.copyto(out, x)
        np.multiply(x, slope, out=out, where=neg)
        return out

    return prelu


def register_kernels(registry: KernelRegistry) -> None:
    """Register the activation kernels."""
    registry.add("Relu", _relu, since=1, flags=OUT_INPLACE)
    registry.add("LeakyRelu", _leaky_relu, since=1, flags=OUT_INPLACE)
    registry.add("Elu", _elu, since=1, flags=OUT_INPLACE)
    registry.add("Selu", _selu, since=1, flags=OUT_INPLACE)
    registry.add("Celu", _celu, since=12, flags=OUT_INPLACE)
    registry.add("Sigmoid", _sigmoid, since=1, flags=OUT_INPLACE)
    registry.add("HardSigmoid", _hard_sigmoid, since=1, flags=OUT_INPLACE)
    registry.add("HardSwish", _hard_swish, since=14, flags=OUT_INPLACE)
    registry.add("Softplus", _softplus, since=1, flags=OUT_INPLACE)
    registry.add("Softsign", _softsign, since=1, flags=OUT_INPLACE)
    registry.add("Mish", _mish, since=18, flags=OUT_INPLACE)
    registry.add("ThresholdedRelu", _thresholded_relu, since=10, flags=OUT_INPLACE)
    registry.add("Shrink", _shrink, since=9, flags=OUT_INPLACE)
    registry.add("Gelu", _gelu, since=20, flags=OUT_INPLACE)
    registry.add("Swish", _swish, since=24, flags=OUT_INPLACE)
    registry.add("PRelu", _prelu, since=1, flags=OUT_INPLACE)
