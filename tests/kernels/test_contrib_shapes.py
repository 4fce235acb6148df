"""Types and signature-fixed shapes through onnxruntime's contrib ops (the ones its
transformer optimizer writes into saved models): ONNX's shape inference does not know
them, so before these rules every value after one was untyped (no Linear fusion) and
every Shape of one ran per call instead of once per input signature."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.compiler.dynamic import content_determined, shape_determined
from tfrt_py.ir import TensorType
from tfrt_py.kernels.families import default_registry

RNG = np.random.default_rng(11)
H = 32


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(arr, name)


def _model(norm: str) -> onnx.ModelProto:
    """x, skip (n, s, 32) -> ``norm`` (com.microsoft) -> MatMul + Add (a Linear) -> FastGelu
    -> Reshape to (n, s * 8) by a shape computed from Shape(norm's output)."""
    ms = "com.microsoft"
    norm_inputs = ["x", "skip", "gamma"] + (["beta"] if norm == "SkipLayerNormalization" else [])
    nodes = [
        helper.make_node(norm, norm_inputs, ["h", "", "", "sum"], domain=ms, epsilon=1e-5),
        helper.make_node("MatMul", ["h", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("FastGelu", ["a"], ["g"], domain=ms),
        helper.make_node("Shape", ["h"], ["hs"]),
        helper.make_node("Gather", ["hs", "i0"], ["n0"], axis=0),
        helper.make_node("Gather", ["hs", "i1"], ["n1"], axis=0),
        helper.make_node("Mul", ["n1", "eight"], ["n18"]),
        helper.make_node("Concat", ["n0", "n18"], ["shape"], axis=0),
        helper.make_node("Reshape", ["g", "shape"], ["y"]),
    ]
    inits = [
        _init("gamma", RNG.standard_normal(H).astype(np.float32)),
        _init("beta", RNG.standard_normal(H).astype(np.float32)),
        _init("w", (RNG.standard_normal((H, 8)) / 6).astype(np.float32)),
        _init("b", RNG.standard_normal(8).astype(np.float32)),
        _init("i0", np.array([0], np.int64)),
        _init("i1", np.array([1], np.int64)),
        _init("eight", np.array([8], np.int64)),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "s", H])
    skip = helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["n", "s", H])
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, None)]  # fmt: skip
    graph = helper.make_graph(nodes, "contrib", [x, skip], outs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("norm", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_values_after_a_skip_norm_are_typed_fused_and_signature_fixed(norm: str) -> None:
    proto = _model(norm)
    m = tfrt_py.load(proto, executor="sync")
    graph = m.prepared.graph
    ops = [n.op_type for n in graph.nodes]
    assert "Linear" in ops and "MatMul" not in ops  # typed, so MatMul + Add fused
    (skip_norm,) = [n for n in graph.nodes if n.op_type == norm]
    (gelu,) = [n for n in graph.nodes if n.op_type == "FastGelu"]
    for v in (skip_norm.outputs[0], skip_norm.outputs[3], gelu.outputs[0]):
        assert v is not None and isinstance(v.type, TensorType) and v.type.shape is not None
    fixed = shape_determined(graph, lambda n: None)
    assert id(skip_norm.outputs[0]) in fixed and id(gelu.outputs[0]) in fixed
    (shape,) = [n for n in graph.nodes if n.op_type == "Shape"]
    registry = default_registry()

    def flags_of(node: Any) -> Any:
        try:
            return registry.lookup(node.domain, node.op_type, node.opset).flags
        except Exception:  # noqa: BLE001 - tfrt_py's fused ops live in another registry
            return None

    # the shape arithmetic after the norm: computed once per input signature
    assert id(shape.outputs[0]) in content_determined(graph, flags_of)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, s in ((1, 16), (3, 5), (1, 16)):  # a second signature, then the first again
        feeds = {k: RNG.standard_normal((n, s, H)).astype(np.float32) for k in ("x", "skip")}
        want = sess.run(None, feeds)
        got = m.run(feeds)
        np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["sum"], want[1], rtol=1e-6, atol=1e-6)
        assert got["y"].shape == (n, s * 8)
