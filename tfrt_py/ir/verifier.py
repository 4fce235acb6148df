"""Structural checks on a Graph, run at load time. Raise GraphError naming the node."""

from __future__ import annotations

from ..errors import GraphError
from .graph import Graph, Value

__all__ = ["verify"]


def verify(graph: Graph, outer: frozenset[int] = frozenset()) -> None:
    """Check that ``graph`` is well formed.

    Every node input is a graph input, a constant, an earlier node's output, or (for nested
    graphs) a value of an enclosing graph; no value is produced twice; names of inputs,
    constants and node outputs are unique; every graph output is defined. ``outer`` holds
    the ids of values visible from enclosing graphs.
    """
    defined: set[int] = set(outer)
    names: dict[str, str] = {}

    def define(v: Value, where: str) -> None:
        if id(v) in defined and id(v) not in outer:
            raise GraphError(f"graph {graph.name!r}: value {v.name!r} is defined twice ({where})")
        if v.name in names:
            raise GraphError(
                f"graph {graph.name!r}: name {v.name!r} is used by {names[v.name]} and {where}"
            )
        names[v.name] = where
        defined.add(id(v))

    for v in graph.inputs:
        define(v, "a graph input")
    for v in graph.constants:
        if v.const is None:
            raise GraphError(f"graph {graph.name!r}: constant {v.name!r} has no data")
        define(v, "a constant")
    for node in graph.nodes:
        where = f"node {node.name!r} ({node.op_type})"
        if not node.op_type:
            raise GraphError(f"graph {graph.name!r}: {where} has no op type")
        for i, inp in enumerate(node.inputs):
            if inp is not None and id(inp) not in defined and not inp.is_const:
                raise GraphError(
                    f"graph {graph.name!r}: {where} input {i} uses {inp.name!r}, "
                    "which is not defined before it (missing input or initializer, or a cycle)"
                )
        for _, sub in node.subgraphs():
            verify(sub, frozenset(defined))
        for out in node.outputs:
            if out is not None:
                define(out, where)
    if not graph.outputs:
        raise GraphError(f"graph {graph.name!r} has no outputs")
    for v in graph.outputs:
        if id(v) not in defined and not v.is_const:
            raise GraphError(f"graph {graph.name!r}: output {v.name!r} is never defined")
