"""Helpers shared by the reduce, norm and resize kernel families.

Most run at load time (attributes, constant inputs); ``ones_vector`` is a cached constant
used per call for BLAS row sums.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..base import KernelContext

__all__ = ["attr_str", "const_ints", "float_dtype", "ones_vector", "stash_dtype"]


def attr_str(ctx: KernelContext, name: str, default: str) -> str:
    """A string attribute (the frontend gives ``str``; ``bytes`` is decoded too)."""
    v: Any = ctx.attr(name, default)
    if isinstance(v, bytes):
        return v.decode("utf-8")
    return str(v)


def const_ints(ctx: KernelContext, i: int) -> tuple[int, ...] | None:
    """Constant input ``i`` as a tuple of ints, or None when it is not a load-time constant
    (or omitted)."""
    c = ctx.const_input(i)
    if c is None:
        return None
    return tuple(int(v) for v in np.asarray(c).reshape(-1))


def float_dtype(dt: np.dtype) -> np.dtype:
    """``dt`` when it is a float type, else float64 (the type integer math is done in)."""
    return dt if dt.kind == "f" else np.dtype(np.float64)


#: ONNX TensorProto element types a ``stash_type`` attribute may name.
_STASH = {1: np.float32, 10: np.float16, 11: np.float64, 16: np.float32}


def stash_dtype(ctx: KernelContext) -> np.dtype:
    """The NumPy dtype of a normalization's ``stash_type`` attribute (bfloat16 -> float32)."""
    code = int(ctx.attr("stash_type", 1))
    if code not in _STASH:
        raise ctx.unsupported(f"stash_type={code} is not supported")
    return np.dtype(_STASH[code])


@functools.lru_cache(maxsize=256)
def ones_vector(n: int, char: str) -> np.ndarray:
    """A read-only vector of ``n`` ones of dtype ``char``: ``x2d @ ones`` sums rows with one
    BLAS call, several times faster than ``np.add.reduce(x2d, axis=1)`` for short rows."""
    v = np.ones(n, dtype=char)
    v.flags.writeable = False
    return v
