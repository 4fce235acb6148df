"""GELU on NumPy arrays (the kernels' paths without numba: a cold start's stand-ins and
hosts without it), shared by the elementwise family's Gelu and the contrib family's
Gelu/BiasGelu/FastGelu. Large contiguous arrays run in cache-sized pieces
(``chunks.by_chunks``): erf's rational approximation is ~15 passes; float32 erf-form GELU
runs on ``activation_ir``'s kernel once it is built. Stateless; any thread.
"""

from __future__ import annotations

import math

import numpy as np

from . import activation_ir
from .chunks import by_chunks
from .erf import erf

__all__ = ["gelu_erf", "gelu_tanh"]

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x/2 (1 + erf(x / sqrt 2)) into ``out`` (may be ``x``'s own buffer) or a new array;
    float32 in one pass on ``activation_ir``'s kernel once it is built (a cold start's warm-up
    builds it for its stand-ins)."""
    y = activation_ir.gelu(x, out)
    if y is not None:
        return y
    y = by_chunks(_gelu_erf, x, out)
    return _gelu_erf(x, out) if y is None else y


def gelu_tanh(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) into ``out`` (may be ``x``'s own
    buffer) or a new array."""
    y = by_chunks(_gelu_tanh, x, out)
    return _gelu_tanh(x, out) if y is None else y


def _gelu_erf(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    t = np.asarray(np.multiply(x, _INV_SQRT2))
    t = erf(t, out=t)
    t += 1
    r = np.multiply(t, x, out=t if out is None else out)
    r *= 0.5
    return r


def _gelu_tanh(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    t = np.asarray(np.multiply(x, x))
    t *= 0.044715
    t += 1
    t *= x
    t *= _SQRT_2_OVER_PI
    np.tanh(t, out=t)
    t += 1
    r = np.multiply(t, x, out=t if out is None else out)
    r *= 0.5
    return r
