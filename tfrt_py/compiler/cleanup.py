"""Clean-up passes: identity/dropout removal (and a Cast to the type its input already
has), dead code elimination, common subexpression elimination (nodes and small constants).

All three only touch the top-level graph and keep every graph output's public name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, Value
from ..ir.dtypes import numpy_dtype
from .context import PassContext, flags_lookup
from .dynamic import is_pure
from .rewrite import Uses, attrs_key, can_replace, replace_many, replace_uses

__all__ = [
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "remove_identities",
]

#: Constants up to this size are merged when equal (hashing bigger ones costs load time).
_CSE_CONST_MAX_BYTES = 1 << 16


def remove_identities(graph: Graph, ctx: PassContext) -> str:
    """Identity, Dropout in inference mode, and a Cast to the dtype its input is known to
    have (torch's ``.float()`` of a float32 tensor: T5's norms and scores) read their
    input through: readers read the input instead, all rewritten in one walk of the graph
    (a walk per removed node took 0.9 s of FCOS-R50's load). The pass's report counts what
    it removed. A Cast goes only where its input's type is known here (an ONNX file's own
    inference) and is one every kernel computes in (``_EXACT_TYPES``)."""
    uses = Uses(graph)
    removed: dict[str, int] = {}
    keep: list[Node] = []
    outputs = {id(v) for v in graph.outputs}
    new_for: dict[int, Value] = {}  # readers of these (not outputs) read through, at the end
    for node in graph.nodes:
        if new_for and any(v is not None and id(v) in new_for for v in node.inputs):
            node.inputs = [None if v is None else new_for.get(id(v), v) for v in node.inputs]
        src = _passthrough_source(node, uses)
        out = node.outputs[0] if node.outputs else None
        if src is not None and out is not None:
            if id(out) not in outputs:
                new_for[id(out)] = src
            elif not replace_uses(graph, out, src):  # an output keeps its name: one walk
                keep.append(node)
                continue
            removed[node.op_type] = removed.get(node.op_type, 0) + 1
            continue
        keep.append(node)
    replace_many(graph, new_for)  # one walk for all (nested graphs' readers included)
    graph.nodes = keep
    if not removed:
        return "nothing to remove"
    return "removed " + ", ".join(f"{n} {op}" for op, n in sorted(removed.items()))


def _passthrough_source(node: Node, uses: Uses) -> Value | None:
    if node.domain != "" or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type == "Identity":
        return node.inputs[0]
    if node.op_type == "Cast":
        return node.inputs[0] if _same_type_cast(node) else None
    if node.op_type != "Dropout":
        return None
    if len(node.outputs) > 1 and node.outputs[1] is not None and uses.count(node.outputs[1]):
        return None  # the mask is read
    if node.opset >= 12 and len(node.inputs) > 2 and node.inputs[2] is not None:
        tm = node.inputs[2].const
        if tm is None or bool(tm):
            return None  # training mode, or not known at load
    return node.inputs[0]


def _same_type_cast(node: Node) -> bool:
    """Whether Cast ``node`` converts to the dtype its input already has (then it is an
    Identity: every ONNX Cast between equal types returns the input's values)."""
    t = node.inputs[0].type  # type: ignore[union-attr]
    have = getattr(t, "dtype", None)
    if have is None or "to" not in node.attrs:
        return False
    try:
        to = numpy_dtype(node.attrs["to"])
    except ValueError:
        return False
    # Only types every kernel computes in: a bfloat16/float16 value may be held in float32
    # between kernels, and its Cast is then the rounding (ONNX's bf16 attention cases)
    return to == have and to.name in _EXACT_TYPES


_EXACT_TYPES = frozenset({"float32", "float64", "int64", "int32", "bool"})


def eliminate_dead_code(graph: Graph, ctx: PassContext) -> str:
    """Remove pure nodes none of whose outputs is read (transitively)."""
    flags_of = flags_lookup(ctx)
    uses = Uses(graph)
    counts = {k: len(v) for k, v in uses.readers.items()}
    for v in graph.outputs:
        counts[id(v)] = counts.get(id(v), 0) + 1
    dead: set[int] = set()
    for node in reversed(graph.nodes):
        if any(o is not None and counts.get(id(o), 0) for o in node.outputs):
            continue
        if not _removable(node, flags_of(node)):
            continue
        dead.add(id(node))
        for v in _reads(node):
            counts[id(v)] -= 1
    graph.nodes = [n for n in graph.nodes if id(n) not in dead]
    return f"removed {len(dead)} dead nodes"


def _removable(node: Node, flags: Any) -> bool:
    """No side effects (random ops have none either: unread, they can go); nested graphs
    could hold custom kernels, so nodes with them stay."""
    return (
        flags is not None
        and flags.pure
        and not flags.is_async
        and not flags.control_flow
        and not any(True for _ in node.subgraphs())
    )


def _reads(node: Node) -> list[Value]:
    out = [v for v in node.inputs if v is not None]
    for _, sub in node.subgraphs():
        out.extend(sub.free_values())
    return out


def eliminate_common_subexpressions(graph: Graph, ctx: PassContext) -> str:
    """Merge equal small constants, then pure nodes with the same op, attributes and
    inputs (in topological order, so chains of equal nodes merge in one sweep)."""
    n_const = _merge_constants(graph)
    flags_of = flags_lookup(ctx)
    seen: dict[Any, Node] = {}
    keep: list[Node] = []
    merged = 0
    new_for: dict[int, Value] = {}  # merged outputs -> the first's, replaced in one walk
    for node in graph.nodes:
        if new_for and any(v is not None and id(v) in new_for for v in node.inputs):
            node.inputs = [None if v is None else new_for.get(id(v), v) for v in node.inputs]
        if not is_pure(node, flags_of(node)):
            keep.append(node)
            continue
        key = (
            node.domain,
            node.op_type,
            node.opset,
            tuple(id(v) if v is not None else None for v in node.inputs),
            tuple(o is None for o in node.outputs),
            attrs_key(node.attrs),
        )
        first = seen.get(key)
        pairs = (
            [(o, f) for o, f in zip(node.outputs, first.outputs) if o is not None]
            if first is not None
            else []
        )
        if first is None or not all(f is not None and can_replace(graph, o, f) for o, f in pairs):
            seen.setdefault(key, node)
            keep.append(node)
            continue
        for o, f in pairs:
            assert f is not None
            if any(v is o for v in graph.outputs):
                replace_uses(graph, o, f)  # the output keeps its name
            else:
                new_for[id(o)] = f
        merged += 1
    graph.nodes = keep
    replace_many(graph, new_for)
    return f"merged {merged} nodes and {n_const} constants"


def _merge_constants(graph: Graph) -> int:
    seen: dict[Any, Value] = {}
    new_for: dict[int, Value] = {}
    merged = 0
    out_ids = {id(v) for v in graph.outputs}
    for c in graph.constants:
        arr = c.const
        if arr is None or arr.nbytes > _CSE_CONST_MAX_BYTES or arr.dtype.kind == "O":
            continue
        if id(c) in out_ids:
            continue
        key = (arr.dtype.str, arr.shape, np.ascontiguousarray(arr).tobytes())
        first = seen.setdefault(key, c)
        if first is not c:
            new_for[id(c)] = first
            merged += 1
    replace_many(graph, new_for)
    return merged
