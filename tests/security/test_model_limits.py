"""Load-time amplification (issue 12, item 4): a few-KB model must not make ``load`` do
unbounded work. Model-local functions that call the next one twice, 40 deep (2**40 nodes
inlined), recursive functions (directly, mutually, through a subgraph), functions nested
past the depth limit, subgraphs nested 10,000 deep, and sparse tensors with huge dense
shapes or bad indices are each a ModelLoadError naming the limit -- never a hang, a
RecursionError or a crash. The limits are settable; ordinary models still load."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.errors import ModelLoadError
from tfrt_py.frontends.onnx import limits

JOIN_S = 60.0
_OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]


def _load_within(source: Any, seconds: float = JOIN_S, **kw: Any) -> Any:
    """``load(source)`` on a thread: its result or exception; fails the test on a hang."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = tfrt_py.load(source, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"load() did not finish in {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["result"]


def _fn(name: str, body: list[onnx.NodeProto]) -> onnx.FunctionProto:
    return helper.make_function("local", name, ["x"], ["y"], body, _OPSETS)


def _call(name: str, x: str, y: str, node_name: str = "") -> onnx.NodeProto:
    return helper.make_node(name, [x], [y], domain="local", name=node_name or None)


def _model(functions: list[onnx.FunctionProto], top: str = "f0") -> onnx.ModelProto:
    g = helper.make_graph(
        [_call(top, "x", "y", "top")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )  # fmt: skip
    return helper.make_model(g, functions=functions, opset_imports=_OPSETS)


def _doubling(levels: int) -> onnx.ModelProto:
    """f0 calls f1 twice, f1 calls f2 twice, ...; the last is one Relu: 2**(levels-1) nodes."""
    fns = []
    for i in range(levels):
        if i == levels - 1:
            body = [helper.make_node("Relu", ["x"], ["y"])]
        else:
            body = [_call(f"f{i + 1}", "x", "t"), _call(f"f{i + 1}", "t", "y")]
        fns.append(_fn(f"f{i}", body))
    return _model(fns)


def test_exponential_function_expansion_fails_fast() -> None:
    source = _doubling(40).SerializeToString()
    assert len(source) < 4096
    with pytest.raises(ModelLoadError, match=r"more than 1,000,000 nodes.*MAX_INLINED_NODES"):
        _load_within(source)


def test_self_recursive_function_is_a_model_load_error() -> None:
    with pytest.raises(ModelLoadError, match=r"local::f0 calls itself: local::f0 -> local::f0"):
        _load_within(_model([_fn("f0", [_call("f0", "x", "y")])]))


def test_mutually_recursive_functions_are_a_model_load_error() -> None:
    fns = [_fn("f0", [_call("f1", "x", "y")]), _fn("f1", [_call("f0", "x", "y")])]
    with pytest.raises(ModelLoadError, match=r"calls itself: local::f0 -> local::f1 -> local::f0"):
        _load_within(_model(fns))


def test_recursion_through_a_subgraph_is_a_model_load_error() -> None:
    then_g = helper.make_graph(
        [_call("f0", "x", "z")], "then", [], [helper.make_tensor_value_info("z", 1, [2])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["z"])], "else", [],
        [helper.make_tensor_value_info("z", 1, [2])],
    )  # fmt: skip
    body = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "s"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    with pytest.raises(ModelLoadError, match="calls itself"):
        _load_within(_model([_fn("f0", body)]))


def test_functions_nested_past_the_depth_limit() -> None:
    n = limits.MAX_FUNCTION_DEPTH + 6
    fns = [_fn(f"f{i}", [_call(f"f{i + 1}", "x", "y")]) for i in range(n)]
    fns.append(_fn(f"f{n}", [helper.make_node("Relu", ["x"], ["y"])]))
    with pytest.raises(ModelLoadError, match=r"nest more than 64 calls deep.*MAX_FUNCTION_DEPTH"):
        _load_within(_model(fns))


def _nested_ifs(levels: int) -> onnx.ModelProto:
    """``levels`` If nodes, each in the then-branch of the one before, built in place
    (O(levels): no CopyFrom of ever deeper graphs)."""
    m = onnx.ModelProto()
    m.ir_version = 8
    m.opset_import.add().version = 17
    g = m.graph
    g.name = "main"
    g.input.add().CopyFrom(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    g.output.add().CopyFrom(helper.make_tensor_value_info("y", TensorProto.BOOL, []))
    for i in range(levels):
        node = g.node.add()
        node.op_type, node.name = "If", f"if{i}"
        node.input.append("c")
        node.output.append("y")
        for branch in ("else_branch", "then_branch"):
            a = node.attribute.add()
            a.name, a.type = branch, onnx.AttributeProto.GRAPH
            a.g.name = f"{branch}{i}"
            a.g.output.add().CopyFrom(helper.make_tensor_value_info("y", TensorProto.BOOL, []))
        leaf = node.attribute[0].g.node.add()
        leaf.op_type = "Identity"
        leaf.input.append("c")
        leaf.output.append("y")
        g = node.attribute[1].g
    leaf = g.node.add()
    leaf.op_type = "Not"
    leaf.input.append("c")
    leaf.output.append("y")
    return m


def test_subgraphs_nested_10000_deep_are_a_model_load_error() -> None:
    proto = _nested_ifs(10_000)
    with pytest.raises(ModelLoadError, match=r"more than 64 levels deep.*MAX_GRAPH_DEPTH"):
        _load_within(proto)
    with pytest.raises(ModelLoadError, match="nest deeper than the protobuf parser allows"):
        _load_within(proto.SerializeToString())


def test_subgraphs_at_the_depth_limit_still_load() -> None:
    model = _load_within(_nested_ifs(limits.MAX_GRAPH_DEPTH))
    for c in (True, False):
        assert not model.run({"c": np.array(c)})["y"]  # then-path: Not(True); else: c


def test_function_bodies_count_toward_subgraph_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function whose body nests Ifs to the limit, called inside an If: one level too
    many, though neither the main graph nor the body alone passes the limit."""
    monkeypatch.setattr(limits, "MAX_GRAPH_DEPTH", 4)
    inner = _nested_ifs(4).graph.node[0]
    body = [helper.make_node("Identity", ["x"], ["c"]), inner]
    body[1].output[0] = "y"
    fn = helper.make_function("local", "deep", ["x"], ["y"], body, _OPSETS)
    then_g = helper.make_graph(
        [helper.make_node("deep", ["c"], ["y"], domain="local")], "then", [],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [])],
    )  # fmt: skip
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["y"])], "else", [],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [])],
    )  # fmt: skip
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [])],
    )  # fmt: skip
    m = helper.make_model(g, functions=[fn], opset_imports=_OPSETS)
    with pytest.raises(ModelLoadError, match=r"more than 4 levels deep.*MAX_GRAPH_DEPTH"):
        _load_within(m)
    monkeypatch.setattr(limits, "MAX_GRAPH_DEPTH", 5)
    model = _load_within(m)
    assert model.run({"c": np.array(True)})["y"] == np.array(False)


def test_limits_are_settable(monkeypatch: pytest.MonkeyPatch) -> None:
    source = _doubling(6).SerializeToString()  # 32 Relus
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(_load_within(source).run({"x": x})["y"], [0.0, 2.0])
    monkeypatch.setattr(limits, "MAX_INLINED_NODES", 31)
    with pytest.raises(ModelLoadError, match="more than 31 nodes"):
        _load_within(source)
    monkeypatch.setattr(limits, "MAX_INLINED_NODES", 1_000_000)
    monkeypatch.setattr(limits, "MAX_FUNCTION_DEPTH", 3)
    with pytest.raises(ModelLoadError, match="more than 3 calls deep"):
        _load_within(source)


def _sparse_model(dims: list[int], indices: list[int], values: list[float]) -> bytes:
    vals = helper.make_tensor("w", TensorProto.FLOAT, [len(values)], values)
    idx = helper.make_tensor("w_idx", TensorProto.INT64, [len(indices)], indices)
    const = helper.make_node(
        "Constant", [], ["w"], name="sparse_const",
        sparse_value=helper.make_sparse_tensor(vals, idx, dims),
    )  # fmt: skip
    g = helper.make_graph(
        [const, helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize(
    ("dims", "indices", "match"),
    [
        ([1 << 40, 1 << 20], [0], r"dense shape .* MAX_SPARSE_DENSE_BYTES"),
        ([-4], [0], "negative dim"),
        ([4], [7], "outside shape"),
        ([4], [-1], "outside shape"),
    ],
)
def test_sparse_constant_is_bounded(dims: list[int], indices: list[int], match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        _load_within(_sparse_model(dims, indices, [1.0]))


def test_good_sparse_constant_still_loads() -> None:
    model = _load_within(_sparse_model([4], [1, 3], [1.0, 2.0]))
    np.testing.assert_array_equal(model.run({"x": np.zeros(4, np.float32)})["y"], [0, 1, 0, 2])
