"""Every op the native tier lowers, collected once: ``lowerings()``.

Each ops module registers its records (``register_lowerings``: ``ops`` the default
domain's and the fused ops' code, ``ops_tx`` the transformer ops', ``ops_dec`` a
decoder step's fused ops, ``ops_gqa`` onnxruntime-genai's GroupQueryAttention,
``ops_nbits`` the 4/8-bit weight-only product, ``ops_quant`` the dynamic int8
product, ``ops_ml``
the classic-ML ops'); the views are registered
here. The lowering (``graph``), rows mode (``rowwise``), the compile budget (``budget``)
and ``blockers`` read this one table.

Built on first use (thread-safe: ``functools.cache`` over a pure function), immutable.
"""

from __future__ import annotations

import functools

from . import ops, ops_dec, ops_encode, ops_gqa, ops_ml, ops_nbits, ops_quant, ops_tx, rows
from .records import Registry

__all__ = ["VIEW_OPS", "lowerings"]

#: Ops whose output is their input's memory with another shape: no code.
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


@functools.cache
def lowerings() -> Registry:
    """The registry of every native lowering."""
    reg = Registry()
    for op in VIEW_OPS:
        reg.add("", op, rows=rows.any_rows, view=True, weight=0)
    ops.register_lowerings(reg)
    ops_tx.register_lowerings(reg)
    ops_dec.register_lowerings(reg)
    ops_gqa.register_lowerings(reg)
    ops_nbits.register_lowerings(reg)
    ops_quant.register_lowerings(reg)
    ops_ml.register_lowerings(reg)
    ops_encode.register_lowerings(reg)
    return reg
