"""The kernel of ``QTable``, the fused op of ``compiler/fuse_qtable.py``, in the private
domain ``tfrt_py.fused``: ``QTable(x, table)`` is ``table[x's byte]`` for 8-bit ``x`` and a
constant 256-entry 8-bit ``table`` -- what a quantized SiLU (QLinearMul of x and
QLinearSigmoid(x)) computes code by code, as one lookup instead of a lookup and a product.
The compiled lookup of QLinearSigmoid's kernel (``contrib.quantized_elementwise``), else
NumPy's ``take``. No ``out=``: returns a fresh array. Any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, Cost, KernelContext
from ..contrib.quantized_elementwise import compiled_lookup
from ..registry import KernelRegistry
from .domain import DOMAIN

__all__ = ["register_kernels"]

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _qtable(ctx: KernelContext) -> ComputeFn:
    table = ctx.const_input(1)
    if table is None or table.shape != (256,) or table.dtype not in _EIGHT_BIT:
        raise ctx.unsupported("QTable takes a constant table of 256 8-bit codes")

    def qtable(x: np.ndarray, _table: Any = None) -> np.ndarray:
        if x.dtype not in _EIGHT_BIT:
            raise TypeError(f"quantized tensors are uint8 or int8, not {x.dtype}")
        y = compiled_lookup(x, table)
        return y if y is not None else table.take(x.view(np.uint8).astype(np.intp))

    return qtable


def _qtable_cost(ctx: KernelContext, ins: list[tuple[int, ...]],
                 outs: list[tuple[int, ...]]) -> Cost:  # fmt: skip
    n = float(np.prod(ins[0])) if ins else 0.0
    return Cost(n, 2.0 * n)


def register_kernels(registry: KernelRegistry) -> None:
    """Register ``QTable`` into ``registry``."""
    registry.add("QTable", _qtable, domain=DOMAIN, cost=_qtable_cost)
