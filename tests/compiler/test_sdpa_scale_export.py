"""The scaled dot-product attention block torch.onnx writes: the head split's target shape
is computed (Shape -> Gather -> Concat -> Reshape) and the scale ``1 / sqrt(sqrt(head
size))`` on Q and K from ``Shape(q)[-1]``, at every call. At load ONNX shape inference
with data propagation gives the head split its static dims, the fold pass turns the scale
into a constant and fuse_linear folds it into the projections' weights: no Mul, Sqrt or
Div is left, and the outputs still match onnxruntime at every length."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import tfrt_py

HIDDEN, HEADS = 16, 2
I64_MAX = 2**63 - 1


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _head_split(p: str, w: np.ndarray, perm: list[int], scale: str) -> list[onnx.NodeProto]:
    """x -> x @ W + b -> (B, S, HEADS, HIDDEN / HEADS) -> Transpose(perm) -> * ``scale``
    (computed here from the split's last dim when it is ``{p}scale``)."""
    d = HIDDEN // HEADS
    nodes = [
        _const(f"{p}w", w),
        _const(f"{p}b", np.linspace(-1, 1, HIDDEN).astype(np.float32)),
        helper.make_node("MatMul", ["x", f"{p}w"], [f"{p}mm"]),
        helper.make_node("Add", [f"{p}b", f"{p}mm"], [f"{p}lin"]),
        helper.make_node("Shape", ["x"], [f"{p}xs"]),
        _const(f"{p}i0", np.array(0, np.int64)),
        _const(f"{p}i1", np.array(1, np.int64)),
        helper.make_node("Gather", [f"{p}xs", f"{p}i0"], [f"{p}n"], axis=0),
        helper.make_node("Gather", [f"{p}xs", f"{p}i1"], [f"{p}s"], axis=0),
        _const(f"{p}ax", np.array([0], np.int64)),
        helper.make_node("Unsqueeze", [f"{p}n", f"{p}ax"], [f"{p}n1"]),
        helper.make_node("Unsqueeze", [f"{p}s", f"{p}ax"], [f"{p}s1"]),
        _const(f"{p}hd", np.array([HEADS, d], np.int64)),
        helper.make_node("Concat", [f"{p}n1", f"{p}s1", f"{p}hd"], [f"{p}target"], axis=0),
        helper.make_node("Reshape", [f"{p}lin", f"{p}target"], [f"{p}split"]),
        helper.make_node("Transpose", [f"{p}split"], [f"{p}t"], perm=perm),
    ]
    computed = [
        # scale = sqrt(1 / sqrt(float(Shape(t)[-1]))), as torch's SDPA export writes it
        helper.make_node("Shape", [f"{p}t"], [f"{p}ts"]),
        _const(f"{p}lo", np.array([-1], np.int64)),
        _const(f"{p}hi", np.array([I64_MAX], np.int64)),
        helper.make_node("Slice", [f"{p}ts", f"{p}lo", f"{p}hi"], [f"{p}last"]),
        helper.make_node("Cast", [f"{p}last"], [f"{p}lastf"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", [f"{p}lastf"], [f"{p}root"]),
        _const(f"{p}one", np.array([1.0], np.float32)),
        helper.make_node("Div", [f"{p}one", f"{p}root"], [f"{p}inv"]),
        helper.make_node("Sqrt", [f"{p}inv"], [f"{p}scale"]),
    ]
    mul = helper.make_node("Mul", [f"{p}t", scale], [f"{p}out"])
    return [*nodes, *(computed if scale == f"{p}scale" else []), mul]


def _model() -> bytes:
    rng = np.random.default_rng(7)
    wq, wk = (rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) for _ in range(2))
    # K's scale is Q's (from Q's head size), as the export writes it
    q = _head_split("q_", wq, [0, 2, 1, 3], "q_scale")
    nodes = [*q, *_head_split("k_", wk, [0, 2, 3, 1], "q_scale")]
    nodes.append(helper.make_node("MatMul", ["q_out", "k_out"], ["scores"]))
    graph = helper.make_graph(
        nodes,
        "sdpa_scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [
            helper.make_tensor_value_info(
                "scores", TensorProto.FLOAT, ["batch", HEADS, "seq", "seq"]
            )
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_the_computed_scale_folds_into_the_projections() -> None:
    data = _model()
    model = tfrt_py.load(data, executor="sync")
    ops = Counter(n.op_type for n in model.graph.nodes)
    assert ops["Linear"] == 2
    assert not {"Mul", "Sqrt", "Div", "Slice", "Cast"} & set(ops), ops
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in ((1, 5, HIDDEN), (3, 17, HIDDEN), (1, 1, HIDDEN)):
        x = rng.standard_normal(shape).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        got = model.run({"x": x})["scores"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
