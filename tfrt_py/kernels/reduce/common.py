"""Helpers shared by the reduce, norm and resize kernel families.

Most run at load time (attributes, constant inputs); ``ones_vector`` is a cached constant
used per call for BLAS row sums.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ...ir.dtypes import ElemType
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


#: The element types a ``stash_type`` attribute may name; bfloat16 statistics are kept in
#: float32.
_STASH = frozenset({ElemType.FLOAT, ElemType.FLOAT16, ElemType.DOUBLE, ElemType.BFLOAT16})


def stash_dtype(ctx: KernelContext) -> np.dtype:
    """The NumPy dtype of a normalization's ``stash_type`` attribute (bfloat16 -> float32)."""
    code = int(ctx.attr("stash_type", ElemType.FLOAT))
    if code not in _STASH:
        raise ctx.unsupported(f"stash_type={code} is not supported")
    if code == ElemType.BFLOAT16:
        return np.dtype(np.float32)
    return ctx.elem_dtype(code, "stash_type")


@functools.lru_cache(maxsize=256)
def ones_vector(n: int, char: str) -> np.ndarray:
    """A read-only vector of ``n`` ones of dtype ``char``: ``x2d @ ones`` sums rows with one
    BLAS call, several times faster than ``np.add.reduce(x2d, axis=1)`` for short rows."""
    v = np.ones(n, dtype=char)
    v.flags.writeable = False
    return v
