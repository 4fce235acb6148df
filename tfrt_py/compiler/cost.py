"""The load-time cost model: FLOPs, bytes and estimated µs per kernel call, from static
shapes; every threshold the runtime decides by, in one table (``THRESHOLDS``).

``model_cost(graph, registry)`` runs once per load (``compiler.prepare``) and is what
everything asks afterwards: the async executor (is a kernel *cheap*: run it inline, or
*expensive*: worth a pool hop), executor selection (``auto``), ``run_async``'s inline-or-
offload rule, the native tier's "tiny model" test, the serving batcher, ``describe()``.

Per node: a kernel registered with a cost function (``KernelDef.cost``) is asked first;
otherwise a family default applies (elementwise ops touch each output element once,
reductions and normalizations each input element a few times, data movement costs bytes
only). Symbolic dims count as 1, so a dynamic model's cost is a per-unit-batch estimate
(batch 1 is the latency case). When a value's rank is unknown the µs estimate is unknown
too, and an op-type rule decides "expensive": a MatMul/Gemm/Conv-like op with a large
constant weight is, anything else is not. A node with nested graphs (If, Loop, Scan) is
expensive when any node in them is.

Pure functions of the IR: thread-safe, no state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..ir import Graph, Node, TensorType, Value
from ..kernels import Cost, KernelContext, KernelRegistry, default_registry
from ..records import record
from .rewrite import op_names

__all__ = [
    "THRESHOLDS",
    "ModelCost",
    "NodeCost",
    "Thresholds",
    "cost_of_shapes",
    "estimate_cost",
    "graph_cost",
    "model_cost",
]


@record(frozen=True)
class Thresholds:
    """Every figure the runtime's decisions rest on (measured on the anchor machine:
    2 cores, NumPy on one core; ``shared/anchors.md``)."""

    #: Throughput of a NumPy kernel on one core: ~20 GFLOP/s and ~20 GB/s.
    flops_per_us: float = 2.0e4
    bytes_per_us: float = 2.0e4
    #: A kernel estimated to run this long (µs) is *expensive*: a pool hop (~150 µs on the
    #: anchor machine) can pay for itself when another expensive kernel runs meanwhile.
    expensive_us: float = 100.0
    #: Unknown shapes: a heavy op with a constant weight of this many elements is expensive.
    big_weight: int = 1 << 16
    #: What the sync interpreter adds per kernel call (Python frame, out= view), µs.
    kernel_overhead_us: float = 1.0
    #: What the async executor adds per kernel (scheduling, releasing consumers), µs.
    dataflow_overhead_us: float = 2.0
    #: The async executor runs cheap kernels on an event loop's thread until their
    #: estimate reaches this many µs, then hands the rest to the pool.
    loop_budget_us: float = 1000.0
    #: Calls that run inline on a loop yield to it once this many µs of them have run on
    #: its thread (a yield costs ~5 µs: a few % of the slice).
    loop_slice_us: float = 250.0
    #: A hand-off to the inter-op pool and back, µs (the async executor's expensive kernels
    #: off the critical path pay one each).
    pool_hop_us: float = 60.0
    #: ``auto`` picks the async executor when it predicts a call at most this fraction of
    #: the sync interpreter's (sync wins ties: no threads, no hops).
    async_gain: float = 0.8
    #: ``auto`` puts a model on the native tier only below this many FLOPs per call:
    #: above it NumPy's BLAS calls amortize their overhead (M2, a 64-256-256-10 MLP, is
    #: 0.17 MFLOP).
    native_max_flops: float = 1e6
    #: ... and below this many when its dims are dynamic (the signature form: boxes of
    #: dims, whose products call BLAS and the packed gemm, and whose first calls measure
    #: the compiled code against the interpreter): a 4-layer GPT-2's decode step (6.4
    #: MFLOP) ran 2x faster compiled than on the interpreter.
    native_dynamic_max_flops: float = 1e8


THRESHOLDS = Thresholds()

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
                "RMSNormalization": 6.0, "BatchNormalization": 2.0, "InstanceNormalization": 6.0,
                "GroupNormalization": 6.0}  # fmt: skip
#: Ops whose cost is dominated by a weight (the unknown-shape rule).
_HEAVY_OPS = frozenset(
    op_names(
        """
        MatMul Gemm Conv ConvTranspose ConvInteger MatMulInteger QLinearConv QLinearMatMul
        Einsum LSTM GRU RNN Attention
        """
    )
)


@record(frozen=True)
class NodeCost:
    """One node's estimate: FLOPs and bytes per call, µs (None: a shape is unknown), and
    its class for the async executor."""

    flops: float
    bytes: float
    us: float | None
    expensive: bool


@record(frozen=True)
class ModelCost:
    """A loaded graph's costs, computed once (``model_cost``). ``nodes`` maps ``id(node)``
    (top-level and nested nodes) to its NodeCost; the totals are over the top level."""

    nodes: dict[int, NodeCost]
    flops: float
    bytes: float
    us: float
    n_kernels: int
    n_expensive: int

    def of(self, node: Node) -> NodeCost:
        """The cost of ``node`` (one of the graph's, at any depth)."""
        return self.nodes[id(node)]

    def expensive(self, node: Node) -> bool:
        """Whether ``node`` is worth a pool hop (the async executor's classification)."""
        c = self.nodes.get(id(node))
        return c.expensive if c is not None else False

    def call_us(self) -> float:
        """Estimated µs for one call on the sync interpreter: the kernels' work plus the
        interpreter's per-kernel overhead."""
        return self.us + self.n_kernels * THRESHOLDS.kernel_overhead_us

    def summary(self) -> str:
        """One line for ``describe()``."""
        return (
            f"cost model: {self.flops / 1e6:.3f} MFLOP, {self.bytes / 1e6:.3f} MB, "
            f"est. {self.call_us():,.0f} µs per call (symbolic dims as 1); "
            f"{self.n_expensive} of {self.n_kernels} kernels expensive "
            f"(>= {THRESHOLDS.expensive_us:g} µs)"
        )


def _shape(v: Value | None) -> tuple[int, ...] | None:
    """Static shape with symbolic dims as 1; () for an omitted value; None: rank unknown."""
    if v is None:
        return ()
    if v.const is not None:
        return tuple(int(d) for d in v.const.shape)
    t = v.type
    if not isinstance(t, TensorType) or t.shape is None:
        return None
    return tuple(d if isinstance(d, int) else 1 for d in t.shape)


def _itemsize(v: Value | None) -> int:
    t = None if v is None else v.type
    if isinstance(t, TensorType) and t.dtype is not None and t.dtype.kind != "O":
        return int(t.dtype.itemsize)
    return 4


def _elems(s: tuple[int, ...]) -> float:
    return float(math.prod(s))


def estimate_cost(node: Node, registry: KernelRegistry | None = None) -> Cost:
    """FLOPs and bytes for one call of ``node``'s kernel (unknown shapes count as scalars)."""
    ins = [_shape(v) or () for v in node.inputs]
    outs = [_shape(v) or () for v in node.outputs]
    return cost_of_shapes(node, ins, outs, registry)


def cost_of_shapes(
    node: Node,
    ins: list[tuple[int, ...]],
    outs: list[tuple[int, ...]],
    registry: KernelRegistry | None = None,
) -> Cost:
    """FLOPs and bytes for one call of ``node``'s kernel on inputs and outputs of these
    shapes (the profiler passes the shapes a call really had)."""
    reg = registry if registry is not None else default_registry()
    kdef = None
    if reg.has(node.domain, node.op_type, node.opset):
        kdef = reg.lookup(node.domain, node.op_type, node.opset, node.name)
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


def _node_cost(node: Node, registry: KernelRegistry, nodes: dict[int, NodeCost]) -> NodeCost:
    subs = [g for _, g in node.subgraphs()]
    if subs:
        inner = [_node_cost(n, registry, nodes) for g in subs for n in g.nodes]
        flops = sum(c.flops for c in inner)
        nbytes = sum(c.bytes for c in inner)
        known = [c.us for c in inner if c.us is not None]
        cost = NodeCost(flops, nbytes, sum(known), any(c.expensive for c in inner))
    else:
        c = estimate_cost(node, registry)
        known_shapes = all(_shape(v) is not None for v in (*node.inputs, *node.outputs))
        t = THRESHOLDS
        us: float | None = None
        if known_shapes and node.outputs:
            us = c.flops / t.flops_per_us + c.bytes / t.bytes_per_us
            expensive = us >= t.expensive_us
        else:
            expensive = node.op_type in _HEAVY_OPS and any(
                v is not None and v.const is not None and v.const.size >= t.big_weight
                for v in node.inputs
            )
        cost = NodeCost(c.flops, c.bytes, us, expensive)
    nodes[id(node)] = cost
    return cost


def model_cost(graph: Graph, registry: KernelRegistry | None = None) -> ModelCost:
    """Every node's cost (nested graphs included) and the top level's totals."""
    reg = registry if registry is not None else default_registry()
    nodes: dict[int, NodeCost] = {}
    top = [_node_cost(n, reg, nodes) for n in graph.nodes]
    return ModelCost(
        nodes,
        sum(c.flops for c in top),
        sum(c.bytes for c in top),
        sum(c.us for c in top if c.us is not None),
        len(top),
        sum(c.expensive for c in top),
    )


def graph_cost(graph: Graph, registry: KernelRegistry | None = None) -> Cost:
    """FLOPs and bytes summed over the graph's top-level nodes."""
    return _sum(estimate_cost(n, registry) for n in graph.nodes)


def _sum(costs: Iterable[Cost]) -> Cost:
    flops = nbytes = 0.0
    for c in costs:
        flops += c.flops
        nbytes += c.bytes
    return Cost(flops, nbytes)
