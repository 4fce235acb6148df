"""IR: builder, verifier, printer, free values of nested graphs."""

from __future__ import annotations

import numpy as np
import pytest

from tfrt_py.errors import GraphError
from tfrt_py.ir import Graph, GraphBuilder, Node, TensorType, Value, format_graph, verify


def test_builder_makes_a_verified_graph_with_types_and_attrs() -> None:
    b = GraphBuilder("g", opset=17)
    x = b.input("x", np.float32, ("batch", 4))
    w = b.const(np.ones((4, 2), np.float32), name="w")
    h = b.op("MatMul", x, w, name="mm")
    y = b.op("LeakyRelu", h, alpha=0.2)
    b.output(y, "y")
    g = b.build()
    assert [v.name for v in g.inputs] == ["x"]
    assert [v.name for v in g.outputs] == ["y"]
    assert g.inputs[0].type == TensorType(np.dtype(np.float32), ("batch", 4))
    assert w.type == TensorType(np.dtype(np.float32), (4, 2))
    assert g.nodes[1].attrs == {"alpha": 0.2}
    assert g.nodes[0].opset == 17
    assert h.producer is g.nodes[0]


def test_builder_rejects_a_reused_name() -> None:
    b = GraphBuilder()
    b.input("x", np.float32, (1,))
    with pytest.raises(ValueError, match="'x' is already used"):
        b.input("x", np.float32, (1,))


def test_verifier_names_an_undefined_input() -> None:
    x = Value("x", TensorType(np.dtype(np.float32), (1,)))
    ghost = Value("ghost")
    y = Value("y")
    g = Graph("g", [x], [y], [Node("Add", [x, ghost], [y], name="add")])
    with pytest.raises(GraphError, match=r"node 'add' \(Add\) input 1 uses 'ghost'"):
        verify(g)


def test_verifier_rejects_out_of_order_nodes_and_missing_outputs() -> None:
    x = Value("x")
    a, b_ = Value("a"), Value("b")
    n1 = Node("Relu", [a], [b_], name="second")
    n2 = Node("Relu", [x], [a], name="first")
    with pytest.raises(GraphError, match="'second'"):
        verify(Graph("g", [x], [b_], [n1, n2]))
    with pytest.raises(GraphError, match="no outputs"):
        verify(Graph("g", [x], [], []))
    with pytest.raises(GraphError, match="output 'zz' is never defined"):
        verify(Graph("g", [x], [Value("zz")], []))


def test_verifier_rejects_duplicate_names() -> None:
    x = Value("x")
    y = Value("x")
    with pytest.raises(GraphError, match="name 'x' is used by"):
        verify(Graph("g", [x], [y], [Node("Relu", [x], [y], name="r")]))


def test_nested_graph_may_use_outer_values_and_reports_them_free() -> None:
    x = Value("x")
    outer_c = Value("k", const=np.array(2.0, np.float32))
    inner_out = Value("io")
    body = Graph("then", [], [inner_out], [Node("Mul", [x, outer_c], [inner_out], name="m")])
    cond, y = Value("cond"), Value("y")
    node = Node("If", [cond], [y], {"then_branch": body, "else_branch": body}, name="if")
    g = Graph("g", [x, cond], [y], [node], [outer_c])
    verify(g)
    assert body.free_values() == [x]  # constants are never "free"
    assert [n.name for n in g.walk()] == ["if", "m", "m"]


def test_printer_shows_inputs_ops_attrs_and_nested_graphs() -> None:
    b = GraphBuilder("show")
    x = b.input("x", np.float32, (1, 3))
    b.output(b.op("Softmax", x, axis=-1, name="sm"), "y")
    text = format_graph(b.build())
    assert "graph show(%x: float32[1,3])" in text
    assert "%y = Softmax(%x) {axis=-1}  # sm" in text
    assert str(TensorType(np.dtype(object), (None, "n"))) == "string[?,n]"
