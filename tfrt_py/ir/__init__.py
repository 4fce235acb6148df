"""The IR: Graph, Node, Value, TensorType; a builder, a verifier and a printer."""

from __future__ import annotations

from .builder import GraphBuilder as GraphBuilder
from .graph import Graph as Graph
from .graph import Node as Node
from .graph import Value as Value
from .printer import format_graph as format_graph
from .types import Dim as Dim
from .types import OpaqueType as OpaqueType
from .types import OptionalType as OptionalType
from .types import SequenceType as SequenceType
from .types import TensorType as TensorType
from .types import ValueType as ValueType
from .types import tensor_type as tensor_type
from .verifier import verify as verify

__all__ = [
    "Dim",
    "Graph",
    "GraphBuilder",
    "Node",
    "OpaqueType",
    "OptionalType",
    "SequenceType",
    "TensorType",
    "Value",
    "ValueType",
    "format_graph",
    "tensor_type",
    "verify",
]
