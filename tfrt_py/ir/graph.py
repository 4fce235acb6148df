"""The IR: Graph, Node, Value.

A Graph owns its nodes (in topological order once verified) and its constant Values.
Values are shared objects: a node's input *is* the producing node's output Value, and a
subgraph (If/Loop/Scan body) may use Values of an enclosing graph directly (outer scope).
The IR is built once at load time and read by the compiler and executors; nothing mutates
it while a model runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .types import TensorType, ValueType

__all__ = ["Graph", "Node", "Value"]


class Value:
    """One SSA value: a graph input, a constant, or one output of one node."""

    __slots__ = ("const", "convert", "default", "name", "producer", "type")

    def __init__(
        self,
        name: str,
        type: ValueType | None = None,
        const: np.ndarray | None = None,
    ) -> None:
        self.name = name
        self.type: ValueType | None = type
        #: The constant's data, for initializers and folded constants; ``None`` otherwise.
        self.const = const
        #: The node that produces this value; ``None`` for inputs and constants.
        self.producer: Node | None = None
        #: For a graph input that is also an initializer (ONNX IR >= 4: an overridable
        #: initializer): the value used when the caller does not feed it. Not a constant:
        #: the optimizer must not fold through it.
        self.default: np.ndarray | None = None
        #: For a graph input the model takes in another form than ``type`` (a map that a
        #: DictVectorizer made a row of: ``compiler/encode_maps.py``): ``convert(feed)``
        #: gives the ``type`` array, ``convert.declared`` the type the model declares.
        self.convert: Any = None
        if const is not None and type is None:
            self.type = TensorType(const.dtype, tuple(const.shape))

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.type})"


class Node:
    """One op application.

    ``inputs`` may hold ``None`` for an omitted optional input; ``outputs`` may hold ``None``
    for an omitted optional output. ``attrs`` maps names to Python values: int, float, str,
    bytes, lists of those, ``np.ndarray`` (tensor attributes), ``Graph`` or list of Graph.
    ``opset`` is the version of the node's domain that the model imports.
    """

    __slots__ = ("attrs", "domain", "inputs", "name", "op_type", "opset", "outputs")

    def __init__(
        self,
        op_type: str,
        inputs: list[Value | None],
        outputs: list[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        name: str = "",
        domain: str = "",
        opset: int = 0,
    ) -> None:
        self.op_type = op_type
        self.domain = "" if domain == "ai.onnx" else domain
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = attrs or {}
        self.name = name
        self.opset = opset
        for v in outputs:
            if v is not None:
                v.producer = self

    def subgraphs(self) -> Iterator[tuple[str, Graph]]:
        """The (attribute name, Graph) pairs of this node's nested graphs."""
        for key, val in self.attrs.items():
            if isinstance(val, Graph):
                yield key, val
            elif isinstance(val, list) and val and isinstance(val[0], Graph):
                for g in val:
                    yield key, g

    def __repr__(self) -> str:
        return f"Node({self.op_type!r}, name={self.name!r})"


class Graph:
    """A graph: inputs, outputs, nodes in topological order, and its constant Values.

    ``opsets`` maps domain ("" is the ONNX default domain) to imported version; nested
    graphs share their model's opsets.
    """

    def __init__(
        self,
        name: str = "graph",
        inputs: list[Value] | None = None,
        outputs: list[Value] | None = None,
        nodes: list[Node] | None = None,
        constants: list[Value] | None = None,
        opsets: dict[str, int] | None = None,
    ) -> None:
        self.name = name
        self.inputs: list[Value] = inputs or []
        self.outputs: list[Value] = outputs or []
        self.nodes: list[Node] = nodes or []
        self.constants: list[Value] = constants or []
        self.opsets: dict[str, int] = opsets or {}

    def walk(self) -> Iterator[Node]:
        """Every node of this graph and of its nested graphs, depth first."""
        for node in self.nodes:
            yield node
            for _, sub in node.subgraphs():
                yield from sub.walk()

    def free_values(self) -> list[Value]:
        """Values this graph uses but neither defines nor holds as constants: the values it
        captures from enclosing graphs, in first-use order (its nested graphs' too)."""
        defined: set[int] = {id(v) for v in self.inputs} | {id(v) for v in self.constants}
        free: dict[int, Value] = {}

        def use(v: Value | None) -> None:
            if v is not None and id(v) not in defined and not v.is_const:
                free.setdefault(id(v), v)

        for node in self.nodes:
            for v in node.inputs:
                use(v)
            for _, sub in node.subgraphs():
                for v in sub.free_values():
                    use(v)
            for out in node.outputs:
                if out is not None:
                    defined.add(id(out))
        for v in self.outputs:
            use(v)
        return list(free.values())
