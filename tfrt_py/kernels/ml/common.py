"""Shared helpers of the ai.onnx.ml kernels: attribute readers and post transforms.

Post transforms follow onnxruntime's definitions (the ONNX-ML spec names them without
formulas): LOGISTIC is the sigmoid, SOFTMAX the row softmax, SOFTMAX_ZERO a row softmax
that leaves exact zeros at zero, PROBIT ``sqrt(2) * erfinv(2 p - 1)`` with the
Winitzki approximation of ``erfinv`` (a = 0.147) that onnxruntime uses.

Every transform takes a float array of shape (N, C), returns a new array of the same
dtype and raises no NumPy warnings (overflow and 0/0 are avoided, not silenced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..base import KernelContext

__all__ = [
    "ML_DOMAIN",
    "PostTransform",
    "as_2d",
    "attr_floats",
    "attr_ints",
    "attr_strings",
    "post_transform",
    "probit",
]

ML_DOMAIN = "ai.onnx.ml"

PostTransform = Callable[[np.ndarray], np.ndarray]

_SQRT2 = float(np.sqrt(2.0))
_A = 0.147
_TWO_PI_A = 2.0 / (np.pi * _A)


def attr_floats(ctx: KernelContext, name: str, dtype: Any = np.float32) -> np.ndarray | None:
    """A FLOATS attribute (or its ``*_as_tensor`` twin) as a 1-D array, or None."""
    tensor = ctx.attr(name + "_as_tensor", None)
    if tensor is not None:
        return np.asarray(tensor).reshape(-1)
    v = ctx.attr(name, None)
    if v is None:
        return None
    return np.asarray(v, dtype=dtype).reshape(-1)


def attr_ints(ctx: KernelContext, name: str) -> np.ndarray | None:
    """An INTS attribute as a 1-D int64 array, or None."""
    v = ctx.attr(name, None)
    if v is None:
        return None
    return np.asarray(v, dtype=np.int64).reshape(-1)


def attr_strings(ctx: KernelContext, name: str) -> list[str] | None:
    """A STRINGS attribute as a list of str (bytes decoded), or None."""
    v = ctx.attr(name, None)
    if v is None:
        return None
    return [s.decode("utf-8", errors="surrogateescape") if isinstance(s, bytes) else s for s in v]


def as_2d(x: np.ndarray) -> np.ndarray:
    """(N, C) view of an ONNX-ML feature input: 1-D is one row, N-D keeps its first dim."""
    if x.ndim == 2:
        return x
    if x.ndim <= 1:
        return x.reshape(1, -1)
    return x.reshape(x.shape[0], -1)


# -- transforms ---------------------------------------------------------------------------


def _logistic(s: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(s))
    d = e + 1
    return np.where(s < 0, e / d, 1 / d).astype(s.dtype, copy=False)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - np.maximum.reduce(s, axis=-1, keepdims=True))
    e /= np.add.reduce(e, axis=-1, keepdims=True)
    return e


def _softmax_zero(s: np.ndarray) -> np.ndarray:
    """Softmax over the entries with |v| > 1e-7; the others become v * exp(-max) ~ 0."""
    vmax = np.maximum.reduce(s, axis=-1, keepdims=True)
    nz = np.abs(s) > 1e-7
    e = np.exp(np.where(nz, s - vmax, 0))
    e = np.where(nz, e, s * np.exp(np.minimum(-vmax, 80)))
    total = np.add.reduce(np.where(nz, e, 0), axis=-1, keepdims=True)
    total[total == 0] = 1
    return (e / total).astype(s.dtype, copy=False)


def probit(p: np.ndarray) -> np.ndarray:
    """``sqrt(2) * erfinv(2 p - 1)`` with onnxruntime's erfinv approximation."""
    x = 2 * p - 1
    sgn = np.where(x < 0, -1, 1).astype(p.dtype, copy=False)
    t = (1 - x) * (1 + x)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log(t)
        v = _TWO_PI_A + 0.5 * lg
        r = sgn * np.sqrt(-v + np.sqrt(v * v - lg / _A))
    return (_SQRT2 * r).astype(p.dtype, copy=False)


def _identity(s: np.ndarray) -> np.ndarray:
    return s


_TRANSFORMS: dict[str, PostTransform] = {
    "NONE": _identity,
    "SOFTMAX": _softmax,
    "LOGISTIC": _logistic,
    "SOFTMAX_ZERO": _softmax_zero,
    "PROBIT": probit,
}
#: TreeEnsemble (ai.onnx.ml 5) encodes post_transform as an int.
POST_TRANSFORM_CODES = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def post_transform(ctx: KernelContext, value: Any = None) -> tuple[str, PostTransform]:
    """The node's post_transform (name, function); unknown names are a load error."""
    if value is None:
        value = ctx.attr("post_transform", "NONE")
    if isinstance(value, int):
        if not 0 <= value < len(POST_TRANSFORM_CODES):
            raise ctx.unsupported(f"post_transform {value} is not one of 0..4")
        value = POST_TRANSFORM_CODES[value]
    if isinstance(value, bytes):
        value = value.decode()
    fn = _TRANSFORMS.get(value)
    if fn is None:
        raise ctx.unsupported(f"post_transform {value!r} is not supported")
    return value, fn


def logistic(s: np.ndarray) -> np.ndarray:
    """The sigmoid, computed without overflow."""
    return _logistic(s)
