"""A readable text form of a Graph, for describe(), inspect and error reports."""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import Graph, Value

__all__ = ["format_graph"]


def _val(v: Value | None) -> str:
    return "_" if v is None else f"%{v.name}"


def _attr(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"tensor<{a.dtype}{list(a.shape)}>"
    if isinstance(a, Graph):
        return f"graph<{a.name}>"
    if isinstance(a, list) and len(a) > 8:
        return f"[{', '.join(map(repr, a[:8]))}, ... ({len(a)})]"
    return repr(a)


def format_graph(graph: Graph, indent: str = "") -> str:
    """Render ``graph`` (and nested graphs, indented) one node per line."""
    ins = ", ".join(f"%{v.name}: {v.type}" for v in graph.inputs)
    outs = ", ".join(f"%{v.name}: {v.type}" for v in graph.outputs)
    lines = [f"{indent}graph {graph.name}({ins}) -> ({outs}) {{"]
    for c in graph.constants:
        lines.append(f"{indent}  %{c.name} = const {c.type}")
    for node in graph.nodes:
        res = ", ".join(_val(v) for v in node.outputs)
        args = ", ".join(_val(v) for v in node.inputs)
        op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        attrs = {k: v for k, v in node.attrs.items() if not isinstance(v, (Graph, list))}
        attrs.update({k: v for k, v in node.attrs.items() if isinstance(v, list)})
        attr_s = (
            " {" + ", ".join(f"{k}={_attr(v)}" for k, v in attrs.items()) + "}" if attrs else ""
        )
        lines.append(f"{indent}  {res} = {op}({args}){attr_s}  # {node.name}")
        for key, sub in node.subgraphs():
            lines.append(f"{indent}    {key}:")
            lines.append(format_graph(sub, indent + "    "))
    lines.append(f"{indent}}}")
    return "\n".join(lines)
