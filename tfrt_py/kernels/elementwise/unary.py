"""Kernels (elementwise): unary math -- Abs ... Tanh, Erf, IsInf, IsNaN, Not, BitwiseNot.

Most compute functions *are* NumPy ufuncs (``fn(x, out=None)``), which keep the input
dtype for every ONNX type they accept. Erf uses ``erf`` (no SciPy).
"""

from __future__ import annotations

import numpy as np

from ..base import OUT, OUT_INPLACE, ComputeFn, KernelBuilder, KernelContext
from ..lib.erf import erf
from ..registry import KernelRegistry

__all__ = ["register_kernels"]

# op -> (ufunc, since, same dtype out): the ufunc keeps the dtype of every type ONNX allows.
# Opsets before 6 only add the ignored ``consumed_inputs`` hint.
_UFUNCS: dict[str, tuple[np.ufunc, int, bool]] = {
    "Abs": (np.absolute, 1, True),
    "Acos": (np.arccos, 7, True),
    "Acosh": (np.arccosh, 9, True),
    "Asin": (np.arcsin, 7, True),
    "Asinh": (np.arcsinh, 9, True),
    "Atan": (np.arctan, 7, True),
    "Atanh": (np.arctanh, 9, True),
    "Ceil": (np.ceil, 1, True),
    "Cos": (np.cos, 7, True),
    "Cosh": (np.cosh, 9, True),
    "Exp": (np.exp, 1, True),
    "Floor": (np.floor, 1, True),
    "Log": (np.log, 1, True),
    "Neg": (np.negative, 1, True),
    "Reciprocal": (np.reciprocal, 1, True),
    "Round": (np.rint, 11, True),  # round half to even, as ONNX
    "Sign": (np.sign, 9, True),
    "Sin": (np.sin, 7, True),
    "Sinh": (np.sinh, 9, True),
    "Sqrt": (np.sqrt, 1, True),
    "Tan": (np.tan, 7, True),
    "Tanh": (np.tanh, 1, True),
    "IsNaN": (np.isnan, 9, False),
    "Not": (np.logical_not, 1, True),
    "BitwiseNot": (np.invert, 18, True),
}


def _unary_builder(uf: np.ufunc) -> KernelBuilder:
    def build(ctx: KernelContext) -> ComputeFn:
        """The ufunc itself: ``fn(x, out=None) -> y`` with y's dtype = x's dtype."""
        return uf

    return build


def _erf(ctx: KernelContext) -> ComputeFn:
    """Erf(x): float32 rational approximation (float16/bfloat16 via float32); float64 to
    1 ulp. ``fn(x, out=None)``."""
    return erf


def _isinf(ctx: KernelContext) -> ComputeFn:
    """IsInf(x) -> bool, honouring detect_positive / detect_negative (default both)."""
    pos = bool(ctx.attr("detect_positive", 1))
    neg = bool(ctx.attr("detect_negative", 1))
    if pos and neg:
        return np.isinf
    if pos or neg:
        target = np.inf if pos else -np.inf

        def isinf_one(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            return np.equal(x, target, out=out)

        return isinf_one

    def isinf_none(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return np.zeros(x.shape, dtype=np.bool_)
        out.fill(False)
        return out

    return isinf_none


def register_kernels(registry: KernelRegistry) -> None:
    """Register the unary math kernels (Abs ... Tanh, Erf, IsInf, IsNaN, Not, BitwiseNot)."""
    for op, (uf, since, same) in _UFUNCS.items():
        registry.add(op, _unary_builder(uf), since=since, flags=OUT_INPLACE if same else OUT)
    registry.add("Erf", _erf, since=9, flags=OUT_INPLACE)
    registry.add("IsInf", _isinf, since=10, flags=OUT)
