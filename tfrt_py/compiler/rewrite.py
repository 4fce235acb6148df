"""Graph surgery shared by the passes: cloning, use lists, replacing values, removing nodes.

Passes rewrite a private clone of the model's graph (``clone_graph``), so a ``Graph`` the
user passed to ``load`` is never mutated. Constant arrays are shared between the clone and
the original: constants are immutable by convention everywhere in tfrt_py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..ir import Graph, Node, TensorType, Value

__all__ = [
    "Uses",
    "can_replace",
    "clone_graph",
    "drop_unused_constants",
    "make_const",
    "op_names",
    "replace_many",
    "replace_uses",
    "static_shape",
    "tensor_dtype",
]


def clone_graph(graph: Graph, outer: dict[int, Value] | None = None) -> Graph:
    """A deep copy of ``graph``: new Values and Nodes (nested graphs too), same names,
    same constant arrays. ``outer`` maps enclosing-graph value ids to their clones."""
    vmap: dict[int, Value] = dict(outer or {})

    def new(v: Value) -> Value:
        c = Value(v.name, v.type, v.const)
        c.default, c.convert = v.default, v.convert
        vmap[id(v)] = c
        return c

    def get(v: Value | None) -> Value | None:
        if v is None:
            return None
        got = vmap.get(id(v))
        # An outer value not in the map (a constant of an enclosing graph) is shared.
        return got if got is not None else v

    out = Graph(graph.name, opsets=dict(graph.opsets))
    out.inputs = [new(v) for v in graph.inputs]
    out.constants = [new(v) for v in graph.constants]
    for node in graph.nodes:
        ins = [get(v) for v in node.inputs]
        attrs = {k: _clone_attr(a, vmap) for k, a in node.attrs.items()}
        outs = [None if v is None else new(v) for v in node.outputs]
        out.nodes.append(
            Node(node.op_type, ins, outs, attrs, name=node.name, domain=node.domain,
                 opset=node.opset)
        )  # fmt: skip
    out.outputs = [v2 for v2 in (get(v) for v in graph.outputs) if v2 is not None]
    return out


def _clone_attr(a: Any, vmap: dict[int, Value]) -> Any:
    if isinstance(a, Graph):
        return clone_graph(a, vmap)
    if isinstance(a, list) and a and isinstance(a[0], Graph):
        return [clone_graph(g, vmap) for g in a]
    return a


class Uses:
    """Who reads each value of one graph: ``readers[id(v)]`` lists the nodes that read
    ``v`` (a node reading it from a nested graph counts); graph outputs are ``outputs``.

    A snapshot: passes rebuild it after they rewrite the graph.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.readers: dict[int, list[Node]] = {}
        for node in graph.nodes:
            for v in _node_reads(node):
                self.readers.setdefault(id(v), []).append(node)
        self.outputs = {id(v) for v in graph.outputs}
        self.inputs = {id(v) for v in graph.inputs}

    def count(self, v: Value) -> int:
        """Readers of ``v`` plus one per appearance as a graph output."""
        n = len(self.readers.get(id(v), ()))
        return n + sum(1 for o in self.graph.outputs if o is v)

    def only_reader(self, v: Value) -> Node | None:
        """The single node reading ``v`` (once) when ``v`` is not a graph output."""
        rs = self.readers.get(id(v), [])
        if len(rs) != 1 or id(v) in self.outputs:
            return None
        node = rs[0]
        if sum(1 for x in node.inputs if x is v) != 1:
            return None
        return node

    def is_output(self, v: Value) -> bool:
        return id(v) in self.outputs


def _node_reads(node: Node) -> Iterable[Value]:
    for v in node.inputs:
        if v is not None:
            yield v
    for _, sub in node.subgraphs():
        yield from sub.free_values()


def can_replace(graph: Graph, old: Value, new: Value) -> bool:
    """Whether ``replace_uses(graph, old, new)`` would succeed."""
    if not any(o is old for o in graph.outputs):
        return True
    return (
        new.producer is not None
        and not any(o is new for o in graph.outputs)
        and not any(i is new for i in graph.inputs)
    )


def replace_uses(graph: Graph, old: Value, new: Value) -> bool:
    """Make every reader of ``old`` (nested graphs included) read ``new``.

    A graph output keeps its public name: when ``old`` is an output, ``new`` takes over
    its name (and declared type), which is only possible when ``new`` is a plain node output
    that is not itself an output. Returns False (and changes nothing) when that is impossible.
    """
    if any(o is old for o in graph.outputs):
        if not can_replace(graph, old, new):
            return False
        new.name = old.name
        if old.type is not None:
            new.type = old.type  # the declared interface wins
        graph.outputs = [new if o is old else o for o in graph.outputs]
    _replace_in(graph, old, new)
    return True


def replace_many(graph: Graph, new_for: dict[int, Value]) -> None:
    """Make every reader of each value ``v`` with ``id(v)`` in ``new_for`` read
    ``new_for[id(v)]`` instead, nested graphs included, in one walk of the graph (a
    ``replace_uses`` per value walks it per value: quadratic when thousands merge). The
    values must not be graph outputs (those keep their names: ``replace_uses``)."""
    if not new_for:
        return
    for node in graph.nodes:
        if any(v is not None and id(v) in new_for for v in node.inputs):
            node.inputs = [None if v is None else new_for.get(id(v), v) for v in node.inputs]
        for _, sub in node.subgraphs():
            replace_many(sub, new_for)
            sub.outputs = [new_for.get(id(v), v) for v in sub.outputs]


def _replace_in(graph: Graph, old: Value, new: Value) -> None:
    for node in graph.nodes:
        node.inputs = [new if v is old else v for v in node.inputs]
        for _, sub in node.subgraphs():
            _replace_in(sub, old, new)
            sub.outputs = [new if v is old else v for v in sub.outputs]


def make_const(graph: Graph, v: Value, data: np.ndarray) -> None:
    """Turn the node output ``v`` into a constant holding ``data`` (in place: every
    reader, nested graphs included, now reads a constant). The producer is not removed."""
    v.const = data
    v.producer = None
    v.type = TensorType(data.dtype, tuple(data.shape))
    graph.constants.append(v)


def static_shape(v: Value | None) -> tuple[int, ...] | None:
    """``v``'s shape when statically known (every dim an int), else None."""
    if v is None:
        return None
    if v.const is not None:
        return tuple(v.const.shape)
    t = v.type
    if isinstance(t, TensorType) and t.shape is not None and t.is_static:
        return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]
    return None


def tensor_dtype(v: Value | None) -> np.dtype | None:
    """``v``'s element type when known."""
    if v is None:
        return None
    if v.const is not None:
        return v.const.dtype
    t = v.type
    return t.dtype if isinstance(t, TensorType) else None


def drop_unused_constants(graph: Graph) -> int:
    """Remove constants nothing reads (nested graphs and outputs count). Returns how many."""
    read: set[int] = {id(v) for v in graph.outputs}
    for node in graph.walk():
        read.update(id(v) for v in node.inputs if v is not None)
        for _, sub in node.subgraphs():
            read.update(id(v) for v in sub.outputs)
    before = len(graph.constants)
    graph.constants = [c for c in graph.constants if id(c) in read]
    return before - len(graph.constants)


def op_names(text: str) -> tuple[str, ...]:
    """Op names written as whitespace-separated words (tables of ops read better so)."""
    return tuple(text.split())


def attrs_key(attrs: dict[str, Any]) -> Any:
    """A hashable key of a node's attributes (CSE, hoisting: equal keys, equal attrs)."""
    return tuple(sorted((k, _attr_key(v)) for k, v in attrs.items()))


def _attr_key(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return ("nd", a.dtype.str, a.shape, a.tobytes() if a.dtype.kind != "O" else repr(a))
    if isinstance(a, (list, tuple)):
        return tuple(_attr_key(x) for x in a)
    if isinstance(a, Graph):
        return ("graph", id(a))
    if isinstance(a, float) and a != a:
        return ("nan",)
    return a
