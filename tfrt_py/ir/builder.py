"""Build IR graphs in Python, without ONNX.

    b = GraphBuilder("mlp", opset=17)
    x = b.input("x", np.float32, (1, 16))
    y = b.op("Relu", b.op("MatMul", x, b.const(w)))
    b.output(y, "y")
    graph = b.build()          # verified

``op`` returns the single output Value, or a tuple when ``n_outputs`` > 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import Graph, Node, Value
from .types import Dim, ValueType, tensor_type
from .verifier import verify

__all__ = ["GraphBuilder"]


class GraphBuilder:
    """Accumulates inputs, constants, nodes and outputs; ``build()`` verifies and returns the
    Graph. Not thread-safe; one builder makes one graph."""

    def __init__(self, name: str = "graph", *, opset: int = 17, ml_opset: int = 3) -> None:
        self._graph = Graph(name, opsets={"": opset, "ai.onnx.ml": ml_opset})
        self._names: set[str] = set()
        self._counter = 0

    def _fresh(self, hint: str) -> str:
        while True:
            self._counter += 1
            name = f"{hint}_{self._counter}"
            if name not in self._names:
                self._names.add(name)
                return name

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"name {name!r} is already used in graph {self._graph.name!r}")
        self._names.add(name)
        return name

    def input(self, name: str, dtype: object, shape: tuple[Dim, ...] | list[Dim] | None) -> Value:
        v = Value(self._claim(name), tensor_type(dtype, shape))
        self._graph.inputs.append(v)
        return v

    def const(self, data: Any, name: str | None = None) -> Value:
        arr = np.asarray(data)
        v = Value(self._claim(name) if name else self._fresh("const"), const=arr)
        self._graph.constants.append(v)
        return v

    def op(
        self,
        op_type: str,
        *inputs: Value | None,
        n_outputs: int = 1,
        domain: str = "",
        name: str | None = None,
        output_types: list[ValueType | None] | None = None,
        **attrs: Any,
    ) -> Any:
        """Append a node; returns its output Value (or a tuple of them)."""
        node_name = self._claim(name) if name else self._fresh(op_type)
        types = output_types or [None] * n_outputs
        outs: list[Value | None] = [
            Value(self._fresh(f"{node_name}_out"), types[i]) for i in range(n_outputs)
        ]
        opset = self._graph.opsets.get(domain, 1)
        self._graph.nodes.append(
            Node(op_type, list(inputs), outs, attrs, name=node_name, domain=domain, opset=opset)
        )
        return outs[0] if n_outputs == 1 else tuple(outs)

    def output(self, value: Value, name: str | None = None) -> Value:
        """Mark ``value`` as a graph output, renaming it to ``name`` when given."""
        if name is not None and name != value.name:
            self._names.discard(value.name)
            value.name = self._claim(name)
        self._graph.outputs.append(value)
        return value

    def build(self) -> Graph:
        verify(self._graph)
        return self._graph
