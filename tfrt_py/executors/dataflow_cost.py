"""Load-time cost classification for the dataflow executor: is a kernel *cheap* (run inline
on whichever thread released it) or *expensive* (worth a thread-pool hop when another
expensive kernel could run at the same time)?

A pool hop costs ~150 µs on the machines we measure (``shared/anchors.md``), so a kernel is
expensive when its estimated run time reaches ``EXPENSIVE_US`` -- parallelism can then pay
for the hop. The estimate comes from the kernel's registered cost function (flops, bytes)
over static shapes (symbolic dims count as 1: batch 1 is the latency case), or from
output size for kernels without one. When a shape is unknown, an op-type heuristic
decides: a MatMul/Gemm/Conv-like op with a large constant weight is expensive, anything
else cheap. Control-flow kernels are expensive when any kernel in their nested graphs is.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..ir import Node, TensorType, Value
from ..kernels import KernelContext, KernelRegistry
from ..kernels.base import Cost

__all__ = ["EXPENSIVE_US", "estimate_us", "is_expensive"]

#: A kernel estimated to run this long (µs) or longer is expensive.
EXPENSIVE_US = 100.0
#: Throughput assumed by the estimate: ~20 GFLOP/s and ~20 GB/s (NumPy on one core).
_FLOPS_PER_US = 2.0e4
_BYTES_PER_US = 2.0e4
#: Ops whose cost is dominated by a weight; with unknown shapes, a constant weight of at
#: least ``_BIG_WEIGHT`` elements makes them expensive.
_HEAVY_OPS = frozenset(
    {
        "MatMul",
        "Gemm",
        "Conv",
        "ConvTranspose",
        "ConvInteger",
        "MatMulInteger",
        "QLinearConv",
        "QLinearMatMul",
        "Einsum",
        "LSTM",
        "GRU",
        "RNN",
        "Attention",
    }
)
_BIG_WEIGHT = 1 << 16


def _shape(v: Value | None) -> tuple[int, ...] | None:
    if v is None:
        return ()
    if v.const is not None:
        return tuple(int(d) for d in v.const.shape)
    t = v.type
    if not isinstance(t, TensorType) or t.shape is None:
        return None
    return tuple(d if isinstance(d, int) else 1 for d in t.shape)


def estimate_us(node: Node, cost_fn: Callable[..., Cost] | None) -> float | None:
    """Estimated µs for one call of ``node``, or None when a shape is unknown."""
    ins = [_shape(v) for v in node.inputs]
    outs = [_shape(v) for v in node.outputs]
    if any(s is None for s in ins) or any(s is None for s in outs) or not outs:
        return None
    in_shapes: list[tuple[int, ...]] = [s for s in ins if s is not None]
    out_shapes: list[tuple[int, ...]] = [s for s in outs if s is not None]
    if cost_fn is not None:
        try:
            cost = cost_fn(KernelContext(node), in_shapes, out_shapes)
        except Exception:  # noqa: BLE001 - a cost function is advisory; fall back to size
            cost = None
        if cost is not None:
            return cost.flops / _FLOPS_PER_US + cost.bytes / _BYTES_PER_US
    out_elems = sum(math.prod(s) for s in out_shapes)
    touched = sum(math.prod(s) for s in in_shapes) + out_elems
    return out_elems / _FLOPS_PER_US + 4.0 * touched / _BYTES_PER_US


def is_expensive(node: Node, registry: KernelRegistry) -> bool:
    """Whether ``node`` is worth running on another thread (see the module docstring)."""
    subgraphs = list(node.subgraphs())
    if subgraphs:
        return any(is_expensive(n, registry) for _, g in subgraphs for n in g.nodes)
    cost_fn = None
    if registry.has(node.domain, node.op_type, node.opset):
        cost_fn = registry.lookup(node.domain, node.op_type, node.opset, node.name).cost
    est = estimate_us(node, cost_fn)
    if est is not None:
        return est >= EXPENSIVE_US
    if node.op_type not in _HEAVY_OPS:
        return False
    return any(
        v is not None and v.const is not None and v.const.size >= _BIG_WEIGHT for v in node.inputs
    )
