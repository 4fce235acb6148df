"""The ``fuse_qdq`` pass: the QDQ groups that onnxruntime's ``quantize_static`` writes become
integer ops (QLinearConv, QLinearMatMul, QGemm, QLinearAdd, ..., or the op itself on the
quantized tensor), with onnxruntime's outputs; groups that must stay float stay float and
the report says why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_static,
)

import tfrt_py
from tests.support.ort_quant import qdq_session
from tfrt_py.compiler import PASSES

F32 = np.float32
EXECUTORS = ("sync", "async")
Build = Callable[[np.random.Generator], tuple[list[Any], list[Any], dict[str, tuple[int, ...]]]]


class _Reader(CalibrationDataReader):
    """Calibration feeds from a seeded RNG."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], n: int = 4) -> None:
        rng = np.random.default_rng(1)
        self._it = iter(
            [{k: rng.standard_normal(s).astype(F32) for k, s in shapes.items()} for _ in range(n)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _w(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((0.3 * rng.standard_normal(shape)).astype(F32), name)


def _float_model(build: Build, path: Path) -> dict[str, tuple[int, ...]]:
    """Write the float model ``build`` makes (fixed seed); returns its input shapes."""
    nodes, inits, shapes = build(np.random.default_rng(0))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in shapes.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return shapes


def _quantized(
    tmp_path: Path, build: Build, per_channel: bool, act: QuantType, **extra: Any
) -> tuple[Path, dict[str, tuple[int, ...]]]:
    src, out = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    shapes = _float_model(build, src)
    quantize_static(
        str(src), str(out), _Reader(shapes), quant_format=QuantFormat.QDQ,
        per_channel=per_channel, activation_type=act, weight_type=QuantType.QInt8,
        extra_options=extra,
    )  # fmt: skip
    return out, shapes


def _feeds(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {k: rng.standard_normal(s).astype(F32) for k, s in shapes.items()}


def _report(model: tfrt_py.Model) -> str:
    return next(r.summary for r in model.prepared.reports if r.name == "fuse_qdq")


def _output_units(proto: onnx.ModelProto) -> dict[str, float | None]:
    """Each graph output's quantization unit: the scale of the DequantizeLinear writing it
    (a quantized output), or None (a float output)."""
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    units: dict[str, float | None] = {o.name: None for o in proto.graph.output}
    for n in proto.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] in units and n.input[1] in inits:
            units[n.output[0]] = float(np.asarray(inits[n.input[1]]).max())
    return units


def _agrees(path: Path, feeds: dict[str, np.ndarray]) -> tfrt_py.Model:
    """tfrt_py (sync and async) gives onnxruntime's outputs: within one quantization unit
    for quantized outputs, within 2e-2 of the largest magnitude for float ones. Returns the
    sync model."""
    proto = onnx.load(str(path))
    sess = qdq_session(str(path))
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    units = _output_units(proto)
    models = {ex: tfrt_py.load(str(path), executor=ex) for ex in EXECUTORS}
    for ex, model in models.items():
        for _ in range(2):  # the second call takes the planned path
            got = model.run(feeds)
            for name, w in want.items():
                g = np.asarray(got[name])
                assert g.shape == w.shape and g.dtype == w.dtype, (ex, name)
                unit = units[name]
                tol = unit * (1 + 1e-5) if unit is not None else 2e-2 * float(np.abs(w).max())
                err = float(np.abs(g.astype(np.float64) - w).max()) if w.size else 0.0
                assert err <= tol, (ex, name, err, tol)
    return models["sync"]


def _ops(model: tfrt_py.Model) -> Counter[str]:
    return Counter(n.op_type for n in model.prepared.graph.nodes)


# -- the float models --------------------------------------------------------------------------


def _conv(bias: bool, relu: bool = False) -> Build:
    def build(rng: np.random.Generator) -> Any:
        ins = ["x", "w"] + (["b"] if bias else [])
        inits = [_w(rng, "w", 8, 3, 3, 3)] + ([_w(rng, "b", 8)] if bias else [])
        nodes = [helper.make_node("Conv", ins, ["c" if relu else "y"], pads=[1, 1, 1, 1])]
        if relu:
            nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        return nodes, inits, {"x": (1, 3, 8, 8)}

    return build


def _residual(rng: np.random.Generator) -> Any:
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    return nodes, [_w(rng, "w", 4, 4, 3, 3), _w(rng, "b", 4)], {"x": (1, 4, 6, 6)}


def _pool_head(rng: np.random.Generator) -> Any:
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node(
            "MaxPool", ["r"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        helper.make_node("GlobalAveragePool", ["m"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = [_w(rng, "w", 16, 3, 3, 3), _w(rng, "b", 16), _w(rng, "fw", 10, 16), _w(rng, "fb", 10)]
    return nodes, inits, {"x": (2, 3, 9, 9)}


def _matmuls(rng: np.random.Generator) -> Any:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    return nodes, [_w(rng, "w1", 16, 32), _w(rng, "w2", 32, 8)], {"x": (5, 16)}


def _concat(rng: np.random.Generator) -> Any:
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("Conv", ["x", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["c1", "c2"], ["y"], axis=1),
    ]
    inits = [_w(rng, "w1", 4, 3, 1, 1), _w(rng, "b1", 4), _w(rng, "w2", 6, 3, 3, 3)]
    return nodes, inits, {"x": (1, 3, 5, 5)}


def _shared_input(rng: np.random.Generator) -> Any:
    """One DequantizeLinear (of x) read by two convs, then a residual Add."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w2", "b2"], ["c2"]),
        helper.make_node("Add", ["c1", "c2"], ["y"]),
    ]
    inits = [_w(rng, "w1", 4, 3, 3, 3), _w(rng, "b1", 4), _w(rng, "w2", 4, 3, 1, 1),
             _w(rng, "b2", 4)]  # fmt: skip
    return nodes, inits, {"x": (1, 3, 6, 6)}


def _activations_resize(rng: np.random.Generator) -> Any:
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", ["s", "c"], ["m"]),
        helper.make_node("LeakyRelu", ["m"], ["l"], alpha=0.1),
        helper.make_node("Resize", ["l", "", "scales"], ["y"], mode="nearest"),
    ]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], F32), "scales")
    return nodes, [_w(rng, "w", 4, 3, 1, 1), _w(rng, "b", 4), scales], {"x": (1, 3, 4, 4)}


CASES: dict[str, tuple[Build, dict[str, int]]] = {
    "conv_bias": (_conv(True), {"QLinearConv": 1}),
    "conv_no_bias": (_conv(False), {"QLinearConv": 1}),
    "conv_relu": (_conv(True, relu=True), {"QLinearConv": 1}),
    "residual": (_residual, {"QLinearConv": 1, "QLinearAdd": 1}),
    "pool_head": (_pool_head, {"QLinearConv": 1, "int MaxPool": 1, "QLinearGlobalAveragePool": 1,
                               "int Flatten": 1, "QGemm": 1}),
    "matmuls": (_matmuls, {"QLinearMatMul": 2}),
    "concat": (_concat, {"QLinearConv": 2, "QLinearConcat": 1}),
    "shared_input": (_shared_input, {"QLinearConv": 2, "QLinearAdd": 1}),
    "activations_resize": (_activations_resize, {"QLinearConv": 1, "QLinearSigmoid": 1,
                                                 "QLinearMul": 1, "QLinearLeakyRelu": 1,
                                                 "int Resize": 1}),
}  # fmt: skip
FLOAT_OPS = {"Conv", "MatMul", "Gemm", "Add", "Mul", "Sigmoid", "LeakyRelu", "Concat",
             "GlobalAveragePool"}  # fmt: skip


@pytest.mark.parametrize("act", [QuantType.QUInt8, QuantType.QInt8], ids=["u8", "s8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.compiles
def test_quantize_static_groups_become_integer_ops(
    tmp_path: Path, case: str, per_channel: bool, act: QuantType
) -> None:
    build, expected = CASES[case]
    path, shapes = _quantized(tmp_path, build, per_channel, act)
    model = _agrees(path, _feeds(shapes))
    n = sum(expected.values())
    by_count = sorted(expected.items(), key=lambda kv: (-kv[1], kv[0]))
    listed = ", ".join(f"{k} x{v}" for k, v in by_count)
    assert _report(model) == f"{n} group{'s' * (n != 1)} to integer ops ({listed}); none left float"
    assert "fuse_qdq: " + _report(model) in model.describe()
    ops = _ops(model)
    assert not FLOAT_OPS & set(ops), ops
    # the DequantizeLinear nodes left: the output's alone (every other one was read by a group)
    assert ops["DequantizeLinear"] == 1, ops


def test_kept_activations_become_table_ops(tmp_path: Path) -> None:
    """``QDQKeepRemovableActivations`` keeps ``DQ -> Relu -> Q``: a 256-entry table."""
    path, shapes = _quantized(tmp_path, _residual, True, QuantType.QUInt8,
                              QDQKeepRemovableActivations=True)  # fmt: skip
    model = _agrees(path, _feeds(shapes))
    assert _report(model) == (
        "4 groups to integer ops (QLinearLeakyRelu x2, QLinearAdd x1, QLinearConv x1); "
        "none left float"
    )


def test_the_pass_runs_before_fold(tmp_path: Path) -> None:
    """After ``fold`` the weights' DequantizeLinear nodes would be float constants and no
    Conv would match: the QLinearConv must be there."""
    assert PASSES.index("shapes") < PASSES.index("fuse_qdq") < PASSES.index("fold")
    path, _ = _quantized(tmp_path, _conv(True), True, QuantType.QUInt8)
    model = tfrt_py.load(str(path))
    assert "QLinearConv x1" in _report(model)
    assert _ops(model)["QLinearConv"] == 1
    off = tfrt_py.load(str(path), optimize=set(PASSES) - {"fuse_qdq"})
    assert "QLinearConv" not in _ops(off) and "fuse_qdq: off" in off.describe()


def test_a_graph_without_quantize_linear_has_nothing_to_fuse(tmp_path: Path) -> None:
    path = tmp_path / "float.onnx"
    _float_model(_conv(True), path)
    assert _report(tfrt_py.load(str(path))) == "nothing to fuse"


# -- groups that stay float ----------------------------------------------------------------


def _edit(path: Path, edit: Callable[[onnx.ModelProto], None]) -> Path:
    proto = onnx.load(str(path))
    edit(proto)
    out = path.with_name("edited.onnx")
    onnx.save(proto, str(out))
    return out


def _node(proto: onnx.ModelProto, op: str) -> onnx.NodeProto:
    return next(n for n in proto.graph.node if n.op_type == op)


def _consumer(proto: onnx.ModelProto, value: str, op: str) -> onnx.NodeProto:
    return next(n for n in proto.graph.node if n.op_type == op and value in n.input)


def test_a_scale_that_is_not_constant_keeps_the_group_float(tmp_path: Path) -> None:
    """An initializer that is also a graph input may be fed: not a constant."""
    path, shapes = _quantized(tmp_path, _conv(True), False, QuantType.QUInt8)

    def overridable(proto: onnx.ModelProto) -> None:
        dq = next(n for n in proto.graph.node if n.output[0] == _node(proto, "Conv").input[0])
        proto.graph.input.append(helper.make_tensor_value_info(dq.input[1], TensorProto.FLOAT, []))

    model = _agrees(_edit(path, overridable), _feeds(shapes))
    assert _report(model) == "0 groups to integer ops; 1 left float (Conv: scale not constant x1)"
    assert _ops(model)["Conv"] == 1


def test_a_float_output_read_twice_keeps_the_group_float(tmp_path: Path) -> None:
    path, shapes = _quantized(tmp_path, _concat, False, QuantType.QUInt8)

    def read_twice(proto: onnx.ModelProto) -> None:
        conv = next(n for n in proto.graph.node if n.output[0] == "c2")
        proto.graph.node.append(helper.make_node("Sigmoid", [conv.output[0]], ["s"]))
        proto.graph.output.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))

    model = _agrees(_edit(path, read_twice), _feeds(shapes))
    assert _report(model) == (
        "2 groups to integer ops (QLinearConcat x1, QLinearConv x1); "
        "1 left float (Conv: output read by other nodes x1)"
    )


def _relu_before_q(zero_point: int | None) -> Callable[[onnx.ModelProto], None]:
    """Put a Relu between the Conv and its QuantizeLinear (the output's zero point set)."""

    def edit(proto: onnx.ModelProto) -> None:
        conv = _node(proto, "Conv")
        q = _consumer(proto, conv.output[0], "QuantizeLinear")
        q.input[0] = "relu_out"
        if zero_point is not None:
            for t in proto.graph.initializer:
                if t.name == q.input[2]:
                    t.CopyFrom(numpy_helper.from_array(np.array(zero_point, np.uint8), t.name))
        nodes = list(proto.graph.node)
        nodes.insert(nodes.index(q), helper.make_node("Relu", [conv.output[0]], ["relu_out"]))
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)

    return edit


def test_a_relu_before_q_joins_the_group_only_when_q_makes_it_redundant(tmp_path: Path) -> None:
    path, shapes = _quantized(tmp_path, _conv(True), True, QuantType.QUInt8)
    proto = onnx.load(str(path))
    zp = _consumer(proto, _node(proto, "Conv").output[0], "QuantizeLinear").input[2]
    assert int(next(numpy_helper.to_array(t) for t in proto.graph.initializer if t.name == zp)) > 0
    kept = _agrees(_edit(path, _relu_before_q(None)), _feeds(shapes))
    assert _report(kept) == (
        "0 groups to integer ops; 1 left float (Conv: Relu not made redundant by Q x1)"
    )
    folded = _agrees(_edit(path, _relu_before_q(0)), _feeds(shapes))
    assert _report(folded) == "1 group to integer ops (QLinearConv x1); none left float"
    assert "Relu" not in _ops(folded)


def test_different_scales_keep_a_maxpool_float(tmp_path: Path) -> None:
    path, shapes = _quantized(tmp_path, _pool_head, False, QuantType.QUInt8)

    def rescale(proto: onnx.ModelProto) -> None:
        q = _consumer(proto, _node(proto, "MaxPool").output[0], "QuantizeLinear")
        scale = next(t for t in proto.graph.initializer if t.name == q.input[1])
        proto.graph.initializer.append(
            numpy_helper.from_array(2 * numpy_helper.to_array(scale), "pool_scale_x2")
        )
        q.input[1] = "pool_scale_x2"
        for n in proto.graph.node:  # the DequantizeLinear after it too
            if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]:
                n.input[1] = "pool_scale_x2"

    model = _agrees(_edit(path, rescale), _feeds(shapes))
    assert "1 left float (MaxPool: scales differ x1)" in _report(model)
    assert _ops(model)["MaxPool"] == 1


def test_16_bit_activations_stay_float(tmp_path: Path) -> None:
    path, shapes = _quantized(tmp_path, _conv(True), False, QuantType.QInt16)
    model = _agrees(path, _feeds(shapes))
    assert _report(model) == "0 groups to integer ops; 1 left float (Conv: int16 not 8-bit x1)"


def _gemm(alpha: float) -> Build:
    def build(rng: np.random.Generator) -> Any:
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=alpha)
        return [node], [_w(rng, "w", 6, 8), _w(rng, "b", 6)], {"x": (3, 8)}

    return build


def test_a_gemm_without_q_after_it_is_a_float_output_qgemm(tmp_path: Path) -> None:
    path, shapes = _quantized(tmp_path, _gemm(1.0), True, QuantType.QUInt8,
                              OpTypesToExcludeOutputQuantization=["Gemm"])  # fmt: skip
    model = _agrees(path, _feeds(shapes))
    assert _report(model) == "1 group to integer ops (QGemm (float output) x1); none left float"
    assert _ops(model) == Counter({"QuantizeLinear": 1, "QGemm": 1})


def test_a_gemm_whose_bias_scale_leaves_out_alpha_stays_float(tmp_path: Path) -> None:
    """The quantizer scales C by a_scale * b_scale; QGemm adds C before alpha."""
    path, shapes = _quantized(tmp_path, _gemm(0.5), False, QuantType.QUInt8)
    model = _agrees(path, _feeds(shapes))
    assert _report(model) == (
        "0 groups to integer ops; "
        "1 left float (Gemm: bias scale is not the product of the input scales x1)"
    )


def test_a_dequantize_linear_without_zero_point_gets_a_zero(tmp_path: Path) -> None:
    path, shapes = _quantized(tmp_path, _conv(True), False, QuantType.QUInt8)

    def no_zero_point(proto: onnx.ModelProto) -> None:
        for n in proto.graph.node:
            if n.input[0] == "x" or n.output[0] == _node(proto, "Conv").input[0]:
                del n.input[2]  # the input's Q and DQ: zero point 0 (uint8)

    model = _agrees(_edit(path, no_zero_point), _feeds(shapes))
    assert _report(model) == "1 group to integer ops (QLinearConv x1); none left float"
