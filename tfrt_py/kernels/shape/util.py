"""Helpers shared by the shape and indexing kernel families (load-time utilities).

Nothing here runs per call except ``along_axis_index``, which builds the fancy index of
the ``*Elements`` ops from an indices array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import KernelContext

__all__ = [
    "along_axis_index",
    "const_ints",
    "input_rank",
    "to_ints",
]


def to_ints(a: Any) -> tuple[int, ...]:
    """An int list/array (any int or float dtype, any rank) as a tuple of Python ints."""
    if isinstance(a, np.ndarray):
        return tuple(int(v) for v in a.reshape(-1).tolist())
    if isinstance(a, (list, tuple)):
        return tuple(int(v) for v in a)
    return (int(a),)


def const_ints(ctx: KernelContext, i: int) -> tuple[int, ...] | None:
    """Input ``i`` as a tuple of ints when it is a load-time constant, else None."""
    c = ctx.const_input(i)
    return None if c is None else to_ints(c)


def input_rank(ctx: KernelContext, i: int = 0) -> int | None:
    """The static rank of input ``i`` when known."""
    t = ctx.input_type(i)
    return None if t is None else t.rank


def along_axis_index(idx: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """The fancy index selecting ``a[i0, ..., idx[i0..], ..., in]`` for every position of
    ``idx`` (GatherElements / ScatterElements). Unlike ``np.take_along_axis``, ``idx`` may be
    smaller than the data on the non-axis dims, as ONNX allows."""
    nd = idx.ndim
    key: list[np.ndarray] = []
    for d, n in enumerate(idx.shape):
        if d == axis:
            key.append(idx)
        else:
            shp = [1] * nd
            shp[d] = n
            key.append(np.arange(n).reshape(shp))
    return tuple(key)
