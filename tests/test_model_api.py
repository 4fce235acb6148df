"""The onnxruntime-shaped parts of the Model API (issue 33): ``run(output_names=...)``,
``model.metadata`` and the types of non-tensor inputs and outputs."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py import metadata
from tfrt_py.errors import InputError
from tfrt_py.ir import GraphBuilder

F32 = TensorProto.FLOAT
X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2


def _two_outputs(**model_fields: Any) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["pos"]), helper.make_node("Neg", ["x"], ["neg"]),
             helper.make_node("Abs", ["x"], ["abs"])]  # fmt: skip
    vi = [helper.make_tensor_value_info(n, F32, [2, 3]) for n in ("x", "pos", "neg", "abs")]
    graph = helper.make_graph(nodes, "three", vi[:1], vi[1:])
    graph.doc_string = "the graph's own words"
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], **model_fields)


@pytest.mark.parametrize("executor", ["sync", "async"])
def test_output_names_returns_those_outputs_in_that_order(executor: str) -> None:
    model = tfrt_py.load(_two_outputs(), executor=executor)
    got = model.run({"x": X}, output_names=["abs", "pos"])
    assert list(got) == ["abs", "pos"]
    np.testing.assert_array_equal(got["abs"], np.abs(X))
    np.testing.assert_array_equal(got["pos"], np.maximum(X, 0))
    got = asyncio.run(model.run_async({"x": X}, output_names=["neg"]))
    assert list(got) == ["neg"]
    np.testing.assert_array_equal(got["neg"], -X)
    assert list(model.run({"x": X}, timeout=5, output_names=("neg",))) == ["neg"]
    assert list(model.run({"x": X})) == ["pos", "neg", "abs"]  # unchanged without them


@pytest.mark.parametrize(
    ("names", "match"),
    [(["nope"], r"\['nope'\] are not outputs of this model; its outputs: \['pos', 'neg', 'abs'\]"),
     ("pos", "must be a list of output names"), ([1], "must be a list of output names")],
)  # fmt: skip
def test_bad_output_names_are_input_errors_before_running(names: Any, match: str) -> None:
    calls = []

    def count(x: np.ndarray) -> np.ndarray:
        calls.append(1)
        return x

    b = GraphBuilder("counted")
    x = b.input("x", np.float32, (2, 3))
    b.output(b.op("Count", x, domain="app"), "pos")
    b.output(b.op("Neg", x), "neg")
    b.output(b.op("Abs", x), "abs")
    model = tfrt_py.load(b.build(), custom_kernels={("app", "Count"): count})
    with pytest.raises(InputError, match=match):
        model.run({"x": X}, output_names=names)
    assert not calls
    np.testing.assert_array_equal(model.run({"x": X}, output_names=["neg"])["neg"], -X)


def test_metadata_reads_what_the_file_says() -> None:
    proto = _two_outputs(producer_name="pytorch", producer_version="2.5", model_version=7,
                         doc_string="a model", domain="org.example")  # fmt: skip
    onnx.helper.set_model_props(proto, {"author": "me", "license": "MIT"})
    meta = tfrt_py.load(proto.SerializeToString()).metadata
    assert (meta.producer_name, meta.producer_version) == ("pytorch", "2.5")
    assert (meta.model_version, meta.doc_string, meta.domain) == (7, "a model", "org.example")
    assert (meta.graph_name, meta.graph_doc_string) == ("three", "the graph's own words")
    assert dict(meta.metadata_props) == {"author": "me", "license": "MIT"}
    assert dict(meta.opset_imports) == {"": 17}
    assert meta.ir_version == proto.ir_version
    with pytest.raises(TypeError):
        meta.metadata_props["author"] = "someone else"  # type: ignore[index]


def test_metadata_of_a_graph_built_in_python_and_a_huge_doc_string() -> None:
    b = GraphBuilder("built")
    b.output(b.op("Neg", b.input("x", np.float32, (2,))), "y")
    meta = tfrt_py.load(b.build()).metadata
    assert meta.graph_name == "built" and meta.producer_name == ""
    proto = _two_outputs(doc_string="x" * (metadata.MAX_TEXT * 10))
    onnx.helper.set_model_props(proto, {f"k{i}": "v" for i in range(metadata.MAX_PROPS + 50)})
    meta = tfrt_py.load(proto).metadata
    assert len(meta.doc_string) == metadata.MAX_TEXT + 3
    assert len(meta.metadata_props) == metadata.MAX_PROPS


def test_non_tensor_outputs_say_what_they_are() -> None:
    """A ZipMap's output is a sequence of maps: its spec says so (it said dtype=None,
    shape=None, as if the type were unknown)."""
    zipmap = helper.make_node("ZipMap", ["p"], ["probs"], domain="ai.onnx.ml",
                              classlabels_int64s=[4, 5])  # fmt: skip
    seq = helper.make_node("SequenceConstruct", ["p", "p"], ["both"])
    map_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(F32, []))
    graph = helper.make_graph(
        [zipmap, seq], "typed", [helper.make_tensor_value_info("p", F32, ["N", 2])],
        [helper.make_value_info("probs", helper.make_sequence_type_proto(map_type)),
         helper.make_tensor_sequence_value_info("both", F32, ["N", 2])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    model = tfrt_py.load(helper.make_model(graph, opset_imports=opsets))
    probs, both = model.outputs
    assert probs.type == "seq<map<int64,float32[]>>" and probs.dtype is None
    assert str(probs) == "probs: seq<map<int64,float32[]>>"
    assert both.type == "seq<float32[N,2]>"
    assert model.inputs[0].type == "tensor"
    out = model.run({"p": np.array([[0.25, 0.75]], np.float32)})
    assert out["probs"] == [{4: 0.25, 5: 0.75}]


def test_custom_kernels_that_are_not_a_mapping_are_a_clear_error() -> None:
    """docs/serving.md's placeholder ``custom_kernels: {...}`` is a set: load failed with
    an AttributeError (the server then showed the model UNAVAILABLE without a reason)."""
    with pytest.raises(ValueError, match=r"custom_kernels must be a mapping .* got a set"):
        tfrt_py.load(_two_outputs(), custom_kernels={Ellipsis})  # type: ignore[arg-type]
