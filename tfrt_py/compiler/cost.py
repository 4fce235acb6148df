"""The load-time cost model: FLOPs and bytes per kernel call, from static shapes.

``estimate_cost(node)`` is what the async executor asks to decide whether a kernel is
cheap (run inline) or expensive (hand to the pool); ``graph_cost`` sums a graph. A kernel
registered with a cost function (``KernelDef.cost``) is asked first; otherwise a family
default applies: elementwise ops touch each output element once, reductions and
normalizations each input element a few times, data movement costs bytes only. Unknown
dims count as 1, so a dynamic model's cost is a per-unit-batch estimate.

Pure functions of the IR: thread-safe, no state.
"""

from __future__ import annotations

import math

from ..ir import Graph, Node, TensorType, Value
from ..kernels import Cost, KernelContext, KernelRegistry, default_registry
from .rewrite import op_names

__all__ = ["EXPENSIVE_FLOPS", "estimate_cost", "graph_cost", "is_expensive"]

#: Above this many FLOPs (or 8x as many bytes) a kernel is worth a thread-pool hop
#: (~150 µs on the anchor machine, i.e. a few hundred MFLOP/s of NumPy work).
EXPENSIVE_FLOPS = 2e6

_MOVE = frozenset(
    op_names(
        """
        Reshape Flatten Squeeze Unsqueeze Identity Transpose Concat Split Slice Gather
        GatherElements GatherND Expand Tile Pad Shape Size Cast CastLike ScatterElements
        ScatterND DepthToSpace SpaceToDepth Dropout
        """
    )
)
_HEAVY_ELEMENTWISE = {"Erf": 8.0, "Gelu": 10.0, "Sigmoid": 4.0, "Tanh": 4.0, "Exp": 4.0,
                      "Log": 4.0, "Pow": 4.0, "Softplus": 6.0, "Mish": 10.0}  # fmt: skip
_REDUCE_LIKE = {"Softmax": 5.0, "LogSoftmax": 5.0, "LayerNormalization": 8.0,
                "BatchNormalization": 2.0, "InstanceNormalization": 6.0,
                "GroupNormalization": 6.0}  # fmt: skip


def _shape(v: Value | None) -> tuple[int, ...]:
    t = None if v is None else v.type
    if not isinstance(t, TensorType) or t.shape is None:
        return ()
    return tuple(d if isinstance(d, int) else 1 for d in t.shape)


def _itemsize(v: Value | None) -> int:
    t = None if v is None else v.type
    if isinstance(t, TensorType) and t.dtype is not None and t.dtype.kind != "O":
        return int(t.dtype.itemsize)
    return 4


def _elems(s: tuple[int, ...]) -> float:
    return float(math.prod(s))


def estimate_cost(node: Node, registry: KernelRegistry | None = None) -> Cost:
    """FLOPs and bytes for one call of ``node``'s kernel, from its values' static types."""
    ins = [_shape(v) for v in node.inputs]
    outs = [_shape(v) for v in node.outputs]
    reg = registry if registry is not None else default_registry()
    try:
        kdef = reg.lookup(node.domain, node.op_type, node.opset, node.name)
    except Exception:  # noqa: BLE001 - no kernel: fall back to the family default
        kdef = None
    if kdef is not None and kdef.cost is not None:
        try:
            return kdef.cost(KernelContext(node), ins, outs)
        except Exception:  # noqa: BLE001 - a cost function must never fail a load
            pass
    return _default_cost(node, ins, outs)


def _default_cost(node: Node, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> Cost:
    in_bytes = sum(_elems(s) * _itemsize(v) for s, v in zip(ins, node.inputs) if v is not None)
    out_bytes = sum(_elems(s) * _itemsize(v) for s, v in zip(outs, node.outputs) if v is not None)
    moved = in_bytes + out_bytes
    y = sum(_elems(s) for s, v in zip(outs, node.outputs) if v is not None)
    op = node.op_type
    if op in ("MatMul", "Gemm") and len(ins) >= 2 and ins[0]:
        k = ins[0][0] if op == "Gemm" and node.attrs.get("transA", 0) else ins[0][-1]
        return Cost(2.0 * y * k, moved)
    if op in ("Conv", "ConvTranspose") and len(ins) >= 2 and len(ins[1]) >= 3:
        w = ins[1]
        per_out = 2.0 * _elems(w[1:])  # C/group * kernel window
        return Cost(per_out * (y if op == "Conv" else _elems(ins[0])), moved)
    if op in _MOVE:
        return Cost(0.0, moved)
    if op in _REDUCE_LIKE:
        return Cost(_REDUCE_LIKE[op] * _elems(ins[0]) if ins else 0.0, moved)
    if op.startswith("Reduce") or op in ("ArgMax", "ArgMin", "CumSum"):
        return Cost(_elems(ins[0]) if ins else 0.0, moved)
    if op.endswith("Pool"):
        window = math.prod(node.attrs.get("kernel_shape", [1]))
        return Cost(y * window, moved)
    return Cost(_HEAVY_ELEMENTWISE.get(op, 1.0) * y, moved)


def graph_cost(graph: Graph, registry: KernelRegistry | None = None) -> Cost:
    """The sum over the graph's top-level nodes."""
    flops = nbytes = 0.0
    for node in graph.nodes:
        c = estimate_cost(node, registry)
        flops += c.flops
        nbytes += c.bytes
    return Cost(flops, nbytes)


def is_expensive(cost: Cost) -> bool:
    """Whether a kernel of this cost is worth running on the thread pool."""
    return cost.flops >= EXPENSIVE_FLOPS or cost.bytes >= 8 * EXPENSIVE_FLOPS
