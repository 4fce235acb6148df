"""Fold what converters compute from a tree's leaf into the tree, and merge summed trees.

skl2onnx writes an IsolationForest as one ``TreeEnsembleRegressor`` per tree whose weight
is the id of the leaf reached, then per tree a ``LabelEncoder`` from leaf id to the
leaf's sample count and another to its depth, a dozen elementwise nodes turning those
into a path length, and a ``Sum`` over the trees: 651 nodes for 50 trees, each paid per
call by the interpreter, and ops the native tier does not lower. Two rewrites make it one
ensemble:

1. **Leaf folding.** A one-tree, one-target regressor (``post_transform`` NONE, SUM,
   every weight attribute as plain floats) is followed by nodes that only combine its
   output with one-element constants, row by row (``_ROW_OPS``). Whatever they compute
   is a function of the leaf reached, so they run once at load on the leaves' values (the
   real kernels, as constant folding runs them) and the tree gets those results as leaf
   weights. Applied only when exactly one value leaves that region, a float32 ``(N, 1)``
   like the tree's own output.
2. **Merging.** A ``Sum`` of two or more such regressors' outputs, each read by the
   Sum alone, whose inputs are one matrix ``X`` or column selections
   ``Gather(X, idx, axis=1)`` of it (feature ids mapped through ``idx``), becomes one
   regressor over ``X`` with all the trees (and the Sum's other inputs, if any, added).

The arithmetic per row is what the graph did (float32 kernels on the same values; the
sum over trees accumulates as the ensemble kernel does rather than in the Sum's order,
a difference at float32's last bits). Model text never reaches code: attributes are
copied as data.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from ..ir import Graph, Node, TensorType, Value
from .context import PassContext
from .fold import run_kernel
from .rewrite import Uses

__all__ = ["fuse_trees"]

ML = "ai.onnx.ml"

#: Ops that compute each row from the same row of their inputs (with one-element
#: constants broadcast), keeping a (N, 1) value (N, 1).
_ROW_OPS = frozenset({
    "Cast", "Identity", "Neg", "Abs", "Log", "Exp", "Sqrt", "Reciprocal", "Floor", "Ceil",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Clip", "Where",
    "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or",
    "Sigmoid", "Tanh", "Relu",
})  # fmt: skip

#: Attributes of a tree's structure, one entry per tree node.
_NODE_ATTRS = (
    "nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes", "nodes_values",
    "nodes_truenodeids", "nodes_falsenodeids",
)  # fmt: skip
#: The per-node attributes that may be absent (their defaults: all zeros / all ones).
_OPTIONAL_NODE_ATTRS = (("nodes_missing_value_tracks_true", 0), ("nodes_hitrates", 1.0))
_KNOWN = frozenset({
    *_NODE_ATTRS, *(a for a, _ in _OPTIONAL_NODE_ATTRS), "target_ids", "target_nodeids",
    "target_treeids", "target_weights", "n_targets", "post_transform", "aggregate_function",
    "base_values",
})  # fmt: skip


def fuse_trees(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    folded = _fold_all(graph, ctx)
    merged = sum(bool(_guarded(_merge_sum, graph, node)) for node in list(graph.nodes))
    if not folded and not merged:
        return "nothing to fuse"
    return f"{folded} leaf computation(s) folded into trees, {merged} Sum(s) of trees merged"


def _guarded(rewrite: Any, *args: Any) -> Any:
    """``rewrite(*args)``, None when the node's attributes are not what the rewrite reads
    (a stranger's model: a string where ints belong, an id out of range); the graph is
    only changed after everything is read, so nothing is half done and the node's own
    kernel then reports the fault."""
    try:
        return rewrite(*args)
    except (TypeError, ValueError, KeyError, IndexError, OverflowError):
        return None


# -- which regressors qualify -----------------------------------------------------------


def _plain(a: Any, default: str) -> str:
    if a is None:
        return default
    return a.decode() if isinstance(a, bytes) else str(a)


def _simple_regressor(node: Node) -> bool:
    """A TreeEnsembleRegressor with one target, no post transform, SUM, all attributes
    in their list forms (no ``*_as_tensor``) and none we do not know."""
    if node.op_type != "TreeEnsembleRegressor" or node.domain != ML or len(node.inputs) != 1:
        return False
    a = node.attrs
    if any(k not in _KNOWN for k in a) or any(a.get(k) is None for k in _NODE_ATTRS):
        return False
    if int(a.get("n_targets", 1)) != 1:
        return False
    if _plain(a.get("post_transform"), "NONE") != "NONE":
        return False
    if _plain(a.get("aggregate_function"), "SUM") != "SUM":
        return False
    n = len(a["nodes_nodeids"])
    if any(len(a[k]) != n for k in _NODE_ATTRS):
        return False
    if any(a.get(k) is not None and len(a[k]) != n for k, _ in _OPTIONAL_NODE_ATTRS):
        return False
    t = len(a.get("target_nodeids") or ())
    if any(len(a.get(k) or ()) != t for k in ("target_ids", "target_treeids", "target_weights")):
        return False
    base = a.get("base_values")
    return base is None or len(base) == 1


def _leaves(node: Node) -> tuple[int, list[int], np.ndarray] | None:
    """(tree id, leaf node ids, the tree's output at each leaf as float32) of a one-tree
    simple regressor, or None."""
    a = node.attrs
    tids = {int(t) for t in a["nodes_treeids"]}
    if len(tids) != 1:
        return None
    (tid,) = tids
    modes = [_plain(m, "") for m in a["nodes_modes"]]
    ids = [int(i) for i, m in zip(a["nodes_nodeids"], modes) if m == "LEAF"]
    if not ids or len(set(ids)) != len(ids):
        return None
    base = float((a.get("base_values") or [0.0])[0])
    out = dict.fromkeys(ids, base)
    for t, nid, w in zip(a.get("target_treeids") or (), a.get("target_nodeids") or (),
                         a.get("target_weights") or ()):  # fmt: skip
        if int(t) != tid or int(nid) not in out:
            return None
        out[int(nid)] += float(w)
    return tid, ids, np.array([out[i] for i in ids], np.float32).reshape(-1, 1)


# -- 1. leaf folding --------------------------------------------------------------------


def _row_node(node: Node, inside: set[int]) -> bool:
    """Whether ``node`` computes row by row from values in ``inside`` and one-element
    constants (a LabelEncoder maps each element; a Reshape to (-1, 1) keeps the rows)."""
    if list(node.subgraphs()):
        return False
    if node.domain == ML and node.op_type == "LabelEncoder":
        return len(node.inputs) == 1 and node.inputs[0] is not None
    if node.domain != "":
        return False
    if node.op_type == "Reshape":
        shape = node.inputs[1] if len(node.inputs) == 2 else None
        return (
            shape is not None and shape.const is not None
            and [int(d) for d in np.asarray(shape.const).reshape(-1)] == [-1, 1]
            and node.inputs[0] is not None and id(node.inputs[0]) in inside
        )  # fmt: skip
    if node.op_type not in _ROW_OPS:
        return False
    for v in node.inputs:
        if v is None or id(v) in inside:
            continue
        if v.const is None or np.asarray(v.const).size != 1:
            return False
    return True


def _region(
    start: Value, uses: Uses, order: list[Node], pos: dict[int, int]
) -> tuple[list[Node], Value] | None:
    """The row-wise nodes downstream of ``start`` (in graph order: ``order`` is the graph's
    node list, ``pos`` each node's index in it) and the one value that leaves them, or
    None when there is none or more than one. Walks the readers only, so a forest of many
    trees costs its own nodes."""
    inside = {id(start)}
    region: list[Node] = []
    heap = sorted({pos[id(r)] for r in uses.readers.get(id(start), [])})
    seen: set[int] = set()
    while heap:  # by position: a node's producers in the region are taken before it
        at = heapq.heappop(heap)
        if at in seen:
            continue
        seen.add(at)
        node = order[at]
        if not _row_node(node, inside):
            continue
        region.append(node)
        for v in node.outputs:
            if v is not None:
                inside.add(id(v))
                for r in uses.readers.get(id(v), []):
                    if pos[id(r)] not in seen:
                        heapq.heappush(heap, pos[id(r)])
    if not region:
        return None
    in_region = {id(n) for n in region}
    leaving: list[Value] = []
    for v in [start] + [o for n in region for o in n.outputs if o is not None]:
        outside = [r for r in uses.readers.get(id(v), []) if id(r) not in in_region]
        if outside or uses.is_output(v):
            leaving.append(v)
    if len(leaving) != 1 or leaving[0] is start:
        return None
    return region, leaving[0]


def _fold_all(graph: Graph, ctx: PassContext) -> int:
    """Leaf folding over every qualifying tree; the graph is rewritten once at the end
    (the trees' regions are disjoint: a region reads one tree and constants)."""
    uses = Uses(graph)
    order = list(graph.nodes)
    pos = {id(n): i for i, n in enumerate(order)}
    new_for: dict[int, Node] = {}
    gone: set[int] = set()
    for node in graph.nodes:
        got = _guarded(_folded, node, uses, order, pos, ctx)
        if got:
            new, region = got
            new_for[id(node)] = new
            gone.update(id(n) for n in region)
    if new_for:
        graph.nodes = [new_for.get(id(n), n) for n in graph.nodes if id(n) not in gone]
    return len(new_for)


def _folded(
    node: Node, uses: Uses, order: list[Node], pos: dict[int, int], ctx: PassContext
) -> tuple[Node, list[Node]] | None:
    """The regressor replacing ``node`` with its leaf region folded in, and the region."""
    if not _simple_regressor(node) or node.outputs[0] is None:
        return None
    leaves = _leaves(node)
    if leaves is None:
        return None
    tid, ids, y = leaves
    got = _region(node.outputs[0], uses, order, pos)
    if got is None:
        return None
    region, out = got
    env: dict[int, np.ndarray] = {id(node.outputs[0]): y}
    for n in region:
        args = [None if v is None else env.get(id(v), v.const) for v in n.inputs]
        results = run_kernel(n, ctx, args)
        if results is None:
            return None
        for v, r in zip(n.outputs, results):
            if v is not None:
                env[id(v)] = r
    table = env[id(out)]
    if table.dtype != np.float32 or table.shape != (len(ids), 1):
        return None
    a = dict(node.attrs)
    a.pop("base_values", None)
    a.update(target_treeids=[tid] * len(ids), target_nodeids=ids, target_ids=[0] * len(ids),
             target_weights=[float(w) for w in table.reshape(-1)])  # fmt: skip
    new = Node(node.op_type, list(node.inputs), [out], a, name=f"{node.name}/leaf_folded",
               domain=ML, opset=node.opset)  # fmt: skip
    return new, region


# -- 2. merging -------------------------------------------------------------------------


def _source(v: Value) -> tuple[Value, np.ndarray | None]:
    """``(X, idx)`` for ``Gather(X, idx, axis=1)`` with a constant 1-D non-negative idx,
    ``(v, None)`` for anything else read as a whole."""
    p = v.producer
    if p is None or p.op_type != "Gather" or p.domain != "" or len(p.inputs) != 2:
        return v, None
    x, idx = p.inputs
    if x is None or idx is None or idx.const is None or int(p.attrs.get("axis", 0)) != 1:
        return v, None
    ix = np.asarray(idx.const)
    if ix.ndim != 1 or ix.dtype.kind not in "iu" or (ix.size and ix.min() < 0):
        return v, None
    return x, ix.astype(np.int64)


def _merge_sum(graph: Graph, node: Node) -> bool:
    if node.op_type != "Sum" or node.domain != "" or node.outputs[0] is None:
        return False
    uses = Uses(graph)
    trees: list[Node] = []
    rest: list[Value] = []
    for v in node.inputs:
        if v is None:
            continue
        p = v.producer
        if (
            p is not None and _simple_regressor(p) and p.outputs[0] is v
            and uses.only_reader(v) is node and p not in trees
        ):  # fmt: skip
            trees.append(p)
        else:
            rest.append(v)
    if len(trees) < 2:
        return False
    if any(t.inputs[0] is None for t in trees):
        return False
    sources = [_source(t.inputs[0]) for t in trees]  # type: ignore[arg-type]
    if len({id(x) for x, _ in sources}) != 1:  # not all one matrix: merge only if one input
        sources = [(t.inputs[0], None) for t in trees]  # type: ignore[misc]
        if len({id(x) for x, _ in sources}) != 1:
            return False
    x = sources[0][0]
    merged = _concatenated(trees, [idx for _, idx in sources])
    if merged is None:
        return False
    out = node.outputs[0]
    if rest:
        part = Value(f"{out.name}/trees", TensorType(np.dtype(np.float32), None))
        new = [Node("TreeEnsembleRegressor", [x], [part], merged, name=f"{node.name}/trees",
                    domain=ML, opset=trees[0].opset),
               Node("Sum", [part, *rest], [out], {}, name=node.name, opset=node.opset)]  # fmt: skip
    else:
        new = [Node("TreeEnsembleRegressor", [x], [out], merged, name=f"{node.name}/trees",
                    domain=ML, opset=trees[0].opset)]  # fmt: skip
    gone = {id(t) for t in trees}
    nodes: list[Node] = []
    for n in graph.nodes:
        if n is node:
            nodes.extend(new)
        elif id(n) not in gone:
            nodes.append(n)
    graph.nodes = nodes
    _drop_unread_gathers(graph, [t.inputs[0] for t in trees])
    return True


def _concatenated(trees: list[Node], idxs: list[np.ndarray | None]) -> dict[str, Any] | None:
    """One regressor's attributes holding every tree of ``trees`` (tree ids renumbered,
    feature ids mapped through each tree's column selection, bases added); None when a
    weight names a tree that has no nodes or a split a column the selection lacks."""
    out: dict[str, list[Any]] = {k: [] for k in (*_NODE_ATTRS, "target_ids", "target_nodeids",
                                                 "target_treeids", "target_weights")}  # fmt: skip
    for k, _ in _OPTIONAL_NODE_ATTRS:
        out[k] = []
    base = 0.0
    next_id = 0
    for t, idx in zip(trees, idxs):
        a = t.attrs
        renum: dict[int, int] = {}
        for tid in a["nodes_treeids"]:
            if int(tid) not in renum:
                renum[int(tid)] = next_id
                next_id += 1
        n = len(a["nodes_nodeids"])
        out["nodes_treeids"] += [renum[int(i)] for i in a["nodes_treeids"]]
        feats = [int(f) for f in a["nodes_featureids"]]
        if idx is not None:
            modes = [_plain(m, "") for m in a["nodes_modes"]]
            if any(m != "LEAF" and not 0 <= f < idx.size for f, m in zip(feats, modes)):
                return None
            feats = [int(idx[f]) if m != "LEAF" else f for f, m in zip(feats, modes)]
        out["nodes_featureids"] += feats
        for k in ("nodes_nodeids", "nodes_modes", "nodes_values", "nodes_truenodeids",
                  "nodes_falsenodeids"):  # fmt: skip
            out[k] += list(a[k])
        for k, default in _OPTIONAL_NODE_ATTRS:
            out[k] += list(a[k]) if a.get(k) is not None else [default] * n
        wt = [int(i) for i in a.get("target_treeids") or ()]
        if any(i not in renum for i in wt):
            return None
        out["target_treeids"] += [renum[i] for i in wt]
        for k in ("target_ids", "target_nodeids", "target_weights"):
            out[k] += list(a.get(k) or ())
        base += float((a.get("base_values") or [0.0])[0])
    merged: dict[str, Any] = dict(out)
    merged.update(n_targets=1, post_transform="NONE", aggregate_function="SUM")
    if base:
        merged["base_values"] = [base]
    return merged


def _drop_unread_gathers(graph: Graph, values: list[Value | None]) -> None:
    uses = Uses(graph)
    dead = {id(v.producer) for v in values if v is not None and v.producer is not None
            and v.producer.op_type == "Gather" and not uses.count(v)}  # fmt: skip
    if dead:
        graph.nodes = [n for n in graph.nodes if id(n) not in dead]
