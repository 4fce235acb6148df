"""The ``fuse_dynamic_quant`` pass: the products ``onnxruntime.quantization.quantize_dynamic``
writes (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul [-> Add bias]) become one
com.microsoft MatMulIntegerToFloat each, with the same bits as the unfused graph and
onnxruntime's outputs; groups that do not fit stay as written, the report saying why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

import tfrt_py
from tests.support.ort_quant import u8s8_saturates
from tfrt_py.compiler import PASSES

F32 = np.float32
EXECUTORS = ("sync", "async")


def _w(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((0.3 * rng.standard_normal(shape)).astype(F32), name)


def _quantized(tmp: Path, weight_type: QuantType, per_channel: bool = False,
               extra_output: str | None = None) -> Path:  # fmt: skip
    """A float model (x -> three MatMuls sharing x, two with a bias Add, a Relu between)
    quantized by quantize_dynamic; ``extra_output`` adds that Value as a graph output."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("MatMul", ["x", "w2"], ["m2"]),
        helper.make_node("MatMul", ["r1", "w3"], ["m3"]),
        helper.make_node("Add", ["b3", "m3"], ["h3"]),
        helper.make_node("Concat", ["h3", "m2"], ["y"], axis=-1),
    ]
    inits = [_w(rng, "w1", 48, 40), _w(rng, "b1", 40), _w(rng, "w2", 48, 24),
             _w(rng, "w3", 40, 24), _w(rng, "b3", 24)]  # fmt: skip
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_output:
        outs.append(helper.make_tensor_value_info(extra_output, TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 5, 48])],
        outs, initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    src, dst = tmp / "float.onnx", tmp / "dynamic.onnx"
    onnx.save(model, src)
    quantize_dynamic(str(src), str(dst), weight_type=weight_type, per_channel=per_channel)
    return dst


def _feeds(batch: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).standard_normal((batch, 5, 48)).astype(F32)}


def _report(m: tfrt_py.Model) -> str:
    return next(ln for ln in m.describe().splitlines() if "fuse_dynamic_quant:" in ln)


def _ops(m: tfrt_py.Model) -> list[str]:
    return [n.op_type for n in m.graph.nodes]


def test_quantize_dynamic_products_become_matmul_integer_to_float(tmp_path: Path) -> None:
    for weight_type, per_channel in [(QuantType.QInt8, False), (QuantType.QUInt8, False),
                                     (QuantType.QInt8, True)]:  # fmt: skip
        path = _quantized(tmp_path, weight_type, per_channel)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        unfused = tfrt_py.load(str(path), optimize=set(PASSES) - {"fuse_dynamic_quant"})
        assert "MatMulIntegerToFloat" not in _ops(unfused)
        for ex in EXECUTORS:
            m = tfrt_py.load(str(path), executor=ex)
            assert "3 MatMulInteger groups to MatMulIntegerToFloat (2 with their bias)" in _report(
                m
            )
            ops = _ops(m)
            assert ops.count("MatMulIntegerToFloat") == 3
            assert "MatMulInteger" not in ops and "Cast" not in ops
            for batch in (1, 3):
                feeds = _feeds(batch)
                got = m.run(feeds)["y"]
                np.testing.assert_array_equal(got, unfused.run(feeds)["y"])  # the same bits
                if weight_type == QuantType.QInt8 and u8s8_saturates():
                    continue  # (tests.support.ort_quant.SATURATES; u8 x u8 is exact)
                want = sess.run(None, feeds)[0]
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_an_intermediate_that_is_a_graph_output_keeps_its_group(tmp_path: Path) -> None:
    """m1 (the first product, before its bias) is also read by the caller: its Add stays,
    the product still fuses (without the bias) and writes m1."""
    path = _quantized(tmp_path, QuantType.QInt8, extra_output="m1")
    m = tfrt_py.load(str(path))
    assert "3 MatMulInteger groups to MatMulIntegerToFloat (1 with their bias)" in _report(m)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got, want = m.run(_feeds()), dict(zip(["y", "m1"], sess.run(None, _feeds())))
    for k in ("y", "m1"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5 * np.abs(want[k]).max())


def test_a_weight_given_at_run_time_is_left_as_written(tmp_path: Path) -> None:
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 4])
    b = helper.make_tensor_value_info("b", TensorProto.INT8, [4, 3])
    nodes = [
        helper.make_node("MatMulInteger", ["a", "b"], ["i"]),
        helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "s"], ["y"]),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    s = numpy_helper.from_array(np.array(0.5, F32), "s")
    graph = helper.make_graph(nodes, "g", [a, b], [y], initializer=[s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    m = tfrt_py.load(model)
    assert "0 MatMulInteger groups" in _report(m) and "weight not constant x1" in _report(m)
    feeds = {"a": np.full((2, 4), 3, np.uint8), "b": np.full((4, 3), -2, np.int8)}
    assert m.run(feeds)["y"].tolist() == [[-12.0] * 3] * 2
