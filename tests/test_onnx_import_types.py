"""The ONNX importer skips ONNX shape inference where the compiler's own propagation types
every value (``import_model(own_types=)``, ``compiler.shapes.propagates_fully``).

ONNX's first inference in a process builds its schema registry (~10-12 ms, the largest
part of a small model's load in a fresh process, issue 33). Skipping it must not change
a single value's type: where the propagation cannot type everything, or a node has no
kernel (its schema function's body may depend on inferred types), inference runs as
before. The slow test holds the two imports equal over every ONNX node case and model the
installed onnx ships."""

from __future__ import annotations

import glob
import os
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.jit_paths import spy_served
from tests.support.spies import record_calls
from tfrt_py.compiler import shapes
from tfrt_py.compiler.shapes import AS_ONNX, propagates_fully
from tfrt_py.frontends.onnx import OwnTypes, import_model
from tfrt_py.frontends.onnx.importer import TRY_WITHOUT_INFERENCE_BYTES
from tfrt_py.ir import Graph
from tfrt_py.kernels import default_registry

OWN = OwnTypes(AS_ONNX, propagates_fully)


def _mlp(batch: str | int = "N", hidden: int = 16, rng_seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(rng_seed)
    w1 = numpy_helper.from_array(rng.standard_normal((8, hidden)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["a"]),
        helper.make_node("Gemm", ["a", "w2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"], axis=-1),
    ]
    g = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w1, b1, w2],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _inference_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per ONNX shape inference run (the real function still runs)."""
    return spy_served(monkeypatch, onnx.shape_inference, "infer_shapes")


def _types(g: Graph) -> list[tuple[str, str]]:
    return [(v.name, str(v.type)) for n in g.nodes for v in n.outputs if v is not None]


def _both(model: onnx.ModelProto) -> tuple[Graph, Graph]:
    has = default_registry().has
    return (import_model(model, None, has, own_types=OWN),
            import_model(model, None, has))  # fmt: skip


def test_a_model_the_propagation_types_is_imported_without_onnx_inference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _inference_calls(monkeypatch)
    skipped, inferred = _both(_mlp())
    assert len(calls) == 1  # the second import only
    assert _types(skipped) == _types(inferred)
    assert dict(_types(skipped))["y"] == "float32[N,3]"


def test_load_gives_the_answers_of_an_import_with_inference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _inference_calls(monkeypatch)
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    model = tfrt_py.load(_mlp().SerializeToString())
    assert len(calls) == 0
    monkeypatch.setattr(shapes, "propagates_fully", lambda g: False)
    before = tfrt_py.load(_mlp().SerializeToString())
    assert len(calls) == 1
    np.testing.assert_array_equal(model.run({"x": x})["y"], before.run({"x": x})["y"])
    assert str(model.outputs[0].shape) == str(before.outputs[0].shape)


def _reshape_to_minus_one() -> onnx.ModelProto:
    """Reshape of a dynamic-batch input to (-1, 4): ONNX names the dim, we cannot."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
        "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([-1, 4], np.int64), "s")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _op_outside_the_rules() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)],
        "reduce",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _without_a_kernel() -> onnx.ModelProto:
    """Relu at an opset our kernel claims, then an op only its schema function serves."""
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mish", ["r"], ["y"])],
        "mish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _big() -> onnx.ModelProto:
    return _mlp(hidden=TRY_WITHOUT_INFERENCE_BYTES // (4 * 8) + 1)


def _old_concat() -> onnx.ModelProto:
    """Concat-1 without ``axis`` concatenates along 1 (from opset 4 the axis is required)."""
    g = helper.make_graph(
        [helper.make_node("Concat", ["x", "x"], ["y"])],
        "concat1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 1)], ir_version=3)


@pytest.mark.parametrize("make", [_reshape_to_minus_one, _op_outside_the_rules, _big, _old_concat])
def test_onnx_inference_still_runs_where_the_propagation_cannot_type_everything(
    monkeypatch: pytest.MonkeyPatch, make: Any
) -> None:
    calls = _inference_calls(monkeypatch)
    skipped, inferred = _both(make())
    assert len(calls) == 2  # each import inferred
    assert _types(skipped) == _types(inferred)


def test_a_node_without_a_kernel_is_imported_with_inference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registry without Mish: the node becomes its schema function's body, whose nodes
    the propagation would all type -- yet the body was chosen without inferred types."""
    registry = default_registry()

    def has(domain: str, op: str, opset: int) -> bool:
        return op != "Mish" and registry.has(domain, op, opset)

    calls = _inference_calls(monkeypatch)
    model = _without_a_kernel()
    skipped = import_model(model, None, has, own_types=OWN)
    inferred = import_model(model, None, has)
    assert len(calls) == 2
    assert "Mish" not in {n.op_type for n in skipped.nodes}
    assert _types(skipped) == _types(inferred)


def _shipped_models() -> list[tuple[str, onnx.ModelProto]]:
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():  # the case generators' own casts overflow on purpose
        warnings.simplefilter("ignore")
        found = [(c.name, c.model) for c in node_cases.collect_testcases(None) if c.model]
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    for path in sorted(glob.glob(os.path.join(root, "**", "model.onnx"), recursive=True)):
        found.append((path, onnx.load(path, load_external_data=False)))
    return found


@pytest.mark.slow
def test_every_shipped_onnx_model_the_propagation_takes_gets_the_types_of_inference() -> None:
    """Over onnx's ~2,000 node cases and test models: each one imported without inference
    has every value typed exactly as the import with inference types it."""
    has = default_registry().has
    taken, differ = 0, []
    for name, model in _shipped_models():
        took: list[bool] = []

        def complete(g: Graph, took: list[bool] = took) -> bool:
            took.append(propagates_fully(g))
            return took[-1]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                skipped = import_model(model, None, has, own_types=OwnTypes(AS_ONNX, complete))
            except Exception:  # noqa: BLE001 - models our importer refuses are not the point
                continue
            if not took or not took[-1]:
                continue
            taken += 1
            if _types(skipped) != _types(import_model(model, None, has)):
                differ.append(name)
    assert taken >= 300, taken  # 369 with onnx 1.23
    assert differ == []


def test_shape_inference_sees_the_weights_as_typed_inputs_and_types_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ONNX's inference serializes the model both ways: the big weights reach it as inputs
    of their type and shape (FCOS-R50's 129 MB were 0.52 s of its 0.53 s), the small ones
    as data (a Reshape target computed from one keeps its dims); every value is typed as
    inference on the whole model types it, and the weights are constants again."""
    from tfrt_py.frontends.onnx import importer

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 256)).astype(np.float32), "w")
    split = numpy_helper.from_array(np.array([0, 4, 64], np.int64), "split")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Reshape", ["h", "split"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, split],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    probes = record_calls(monkeypatch, onnx.shape_inference, "infer_shapes")
    graph = import_model(model, None, default_registry().has)
    (probe,) = probes
    assert probe.ByteSize() < 2048 < importer.INFER_DATA_MAX_BYTES < model.ByteSize()
    assert [t.name for t in probe.graph.initializer] == ["split"]
    full = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    want = {v.name: v.type for v in full.graph.value_info}
    got = importer._with_inferred_types(model)
    assert {v.name: v.type for v in got.graph.value_info} == want and "h" in want
    assert list(got.graph.initializer) == list(model.graph.initializer)
    assert [v.name for v in got.graph.input] == ["x"]
    assert dict(_types(graph))["y"] == "float32[N,4,64]"
    assert {v.name for v in graph.constants} >= {"w", "split"}
