"""Load-time partition of a streamed graph into stages, and each stage's weight layout.

A *streamed weight* is an external-data initializer that the importer turned into an extra
graph input (``StreamedWeight.value``); its bytes stay on disk until a stage needs them.
``partition`` walks the optimized graph's nodes in topological order and cuts a new stage
when the next node's new weights would push the current stage past ``cap`` bytes (about
half the weight budget, so two stages fit at once: one computing, one being read). Nodes
without streamed weights join the current stage. A weight read by nodes of two stages is
loaded by each of them. Each stage records the values it reads from earlier stages or the
feeds (``inputs``), the values later stages or the graph outputs read (``outputs``), its
weights at 64-byte-aligned offsets within its region (``nbytes`` in all) and the cost
model's FLOP estimate. Pure functions of the IR, run once per load on the caller's thread.
"""

from __future__ import annotations

from dataclasses import field

from ..compiler.cost import estimate_cost
from ..errors import ModelLoadError
from ..executors.program import Program, compile_program, node_captures
from ..frontends.onnx.external_ref import ExternalRef
from ..ir import Graph, Node, Value
from ..kernels import KernelRegistry
from ..records import record
from .rows import RowGather

__all__ = [
    "ALIGN",
    "Stage",
    "StreamedWeight",
    "aligned",
    "compile_stages",
    "max_node_weights",
    "partition",
]

#: Every weight starts at a multiple of this many bytes inside the weight arena.
ALIGN = 64


def aligned(n: int) -> int:
    """``n`` rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


@record(frozen=True)
class StreamedWeight:
    """One weight of one stage: the graph input that stands for it, where its bytes live on
    disk, and where they go inside the stage's region of the arena."""

    value: Value
    ref: ExternalRef
    offset: int


@record
class Stage:
    """A run of nodes (topological order) and the streamed weights they read."""

    index: int
    nodes: list[Node]
    weights: list[StreamedWeight]
    nbytes: int
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    constants: list[Value] = field(default_factory=list)
    #: Ids of values (not weights) whose last reader is this stage: dropped after it runs.
    drop_after: list[int] = field(default_factory=list)
    flops: float = 0.0
    program: Program | None = None
    #: A stage of one Gather of a row-read weight (``rows.py``): no program, no weights.
    gather: RowGather | None = None

    def op_summary(self) -> str:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        return ", ".join(f"{k} x{v}" for k, v in counts.items()) or "no nodes"


def _reads(node: Node) -> list[Value]:
    return [v for v in node.inputs if v is not None] + node_captures(node)


def _row_table(node: Node, rows: dict[int, ExternalRef]) -> ExternalRef | None:
    """The row-read table ``node`` gathers from (its data input), or None."""
    data = node.inputs[0] if node.inputs else None
    return rows.get(id(data)) if data is not None else None


def max_node_weights(graph: Graph, refs: dict[int, ExternalRef]) -> tuple[int, Node | None]:
    """The most streamed-weight bytes (64-byte aligned) any one node reads, and that node:
    the arena room a budget must leave, since a node's weights are resident together. A
    weight that is a graph output and read by no node counts alone (node None). At least
    ``ALIGN``: even a budget for an empty stage holds one aligned slot."""
    best: tuple[int, Node | None] = (ALIGN, None)
    for node in graph.nodes:
        need = sum(aligned(refs[i].nbytes) for i in {id(v) for v in _reads(node) if id(v) in refs})
        if need > best[0]:
            best = (need, node)
    for v in graph.outputs:
        if id(v) in refs and aligned(refs[id(v)].nbytes) > best[0]:
            best = (aligned(refs[id(v)].nbytes), None)
    return best


def partition(
    graph: Graph,
    refs: dict[int, ExternalRef],
    cap: int,
    limit: int,
    registry: KernelRegistry,
    *,
    needed_hint: int = 0,
    rows: dict[int, ExternalRef] | None = None,
) -> list[Stage]:
    """Cut ``graph`` into stages whose weights fit in ``cap`` bytes where possible.

    ``refs`` maps the id of each streamed-weight input Value to its ExternalRef; ``rows``
    the row-read weights (``rows.row_read_weights``, not in ``refs``): each Gather of one
    is a stage of its own (``Stage.gather``), between the stages around it. A node
    whose own weights exceed ``limit`` (the bytes the arena may use) is a ModelLoadError
    that names the node and says how much budget would be needed (``needed_hint`` bytes
    are added: the resident constants the budget also covers).
    """
    rows = rows or {}
    groups: list[tuple[list[Node], dict[int, Value]]] = []
    cur_nodes: list[Node] = []
    cur_w: dict[int, Value] = {}
    cur_bytes = 0
    for node in graph.nodes:
        if _row_table(node, rows) is not None:  # a Gather of rows: a stage of its own
            if cur_nodes:
                groups.append((cur_nodes, cur_w))
            groups.append(([node], {}))
            cur_nodes, cur_w, cur_bytes = [], {}, 0
            continue
        ws = {id(v): v for v in _reads(node) if id(v) in refs}
        need = sum(aligned(refs[i].nbytes) for i in ws)
        if need > limit:
            raise ModelLoadError(
                f"memory_budget too small: node {node.name!r} ({node.op_type}) alone reads "
                f"{need:,} bytes of streamed weights; the budget leaves {limit:,} bytes for "
                f"weights. Needs memory_budget >= {need + needed_hint:,} bytes "
                f"(>= {2 * need + needed_hint:,} to overlap reading with compute)"
            )
        add = sum(aligned(refs[i].nbytes) for i in ws if i not in cur_w)
        if cur_w and add and cur_bytes + add > cap:
            groups.append((cur_nodes, cur_w))
            cur_nodes, cur_w, cur_bytes = [], {}, 0
            add = need
        cur_nodes.append(node)
        cur_w.update(ws)
        cur_bytes += add
    for v in graph.outputs:  # a graph output that is a weight: the last stage loads it
        if id(v) in refs and id(v) not in cur_w:
            cur_w[id(v)] = v
    if cur_nodes or cur_w or not groups:
        groups.append((cur_nodes, cur_w))
    return _stages(graph, groups, refs, registry, rows)


def _stages(
    graph: Graph,
    groups: list[tuple[list[Node], dict[int, Value]]],
    refs: dict[int, ExternalRef],
    registry: KernelRegistry,
    rows: dict[int, ExternalRef],
) -> list[Stage]:
    n = len(groups)
    produced: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for s, (nodes, _) in enumerate(groups):
        for node in nodes:
            for v in _reads(node):
                last_read[id(v)] = s
            for o in node.outputs:
                if o is not None:
                    produced[id(o)] = s
    for v in graph.outputs:
        last_read[id(v)] = n  # read "after the last stage": never dropped
    stages: list[Stage] = []
    for s, (nodes, wmap) in enumerate(groups):
        weights, off = [], 0
        for v in wmap.values():
            weights.append(StreamedWeight(v, refs[id(v)], off))
            off += aligned(refs[id(v)].nbytes)
        st = Stage(s, nodes, weights, off)
        seen: set[int] = set()
        for node in nodes:
            for v in _reads(node):
                if id(v) in seen or id(v) in wmap or id(v) in rows or produced.get(id(v)) == s:
                    continue
                seen.add(id(v))
                (st.constants if v.is_const else st.inputs).append(v)
            st.flops += estimate_cost(node, registry).flops
            for o in node.outputs:
                if o is not None and last_read.get(id(o), -1) > s:
                    st.outputs.append(o)
        st.outputs += [v for v in wmap.values() if any(v is o for o in graph.outputs)]
        st.drop_after = [i for i, last in last_read.items() if last == s and i not in refs]
        table = _row_table(nodes[0], rows) if len(nodes) == 1 else None
        if table is not None:
            out, idx = nodes[0].outputs[0], nodes[0].inputs[1]
            assert out is not None and idx is not None
            st.gather = RowGather(nodes[0], table, idx, out)
        stages.append(st)
    return stages


def compile_stages(graph: Graph, stages: list[Stage], registry: KernelRegistry) -> None:
    """Compile each stage as its own Program: inputs are the stage's activations then its
    weights (in ``Stage.weights`` order), outputs its ``outputs``. Builds kernels only; no
    weight byte is read. A row-gather stage has no program."""
    for st in stages:
        if st.gather is not None:
            continue
        sub = Graph(
            f"{graph.name}/stage{st.index}",
            inputs=st.inputs + [w.value for w in st.weights],
            outputs=list(st.outputs),
            nodes=list(st.nodes),
            constants=list(st.constants),
            opsets=dict(graph.opsets),
        )
        st.program = compile_program(sub, registry)
