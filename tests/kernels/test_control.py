"""If/Loop/Scan and sequence/optional kernels, through tfrt_py.load, against onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py.model

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _t(name: str, elem: int, shape: Any = None) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list, inputs: list, outputs: list, opset: int = 17, inits: Any = ()) -> Any:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _both(model: Any, feeds: dict) -> tuple[list, list]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)
    got = list(tfrt_py.model.load(model).run(feeds).values())
    return got, expected


def _assert_same(got: Any, exp: Any) -> None:
    if isinstance(exp, list):
        assert isinstance(got, list) and len(got) == len(exp)
        for g, e in zip(got, exp, strict=True):
            _assert_same(g, e)
        return
    got = np.asarray(got)
    assert got.dtype == exp.dtype and got.shape == exp.shape
    np.testing.assert_allclose(got, exp, rtol=1e-6)


def _loop_model(with_m: bool, with_cond: bool) -> Any:
    # body: acc += x * (i + 1); cond = acc < limit; scan out = acc
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Add", ["i_f", "one"], ["i1"]),
            helper.make_node("Mul", ["x", "i1"], ["inc"]),  # x is captured from the outer graph
            helper.make_node("Add", ["acc_in", "inc"], ["acc_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["tot"], keepdims=0),
            helper.make_node("Less", ["tot", "limit"], ["cond_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan"]),
        ],
        "body",
        [_t("i", I64, []), _t("c", B, []), _t("acc_in", F, [2])],
        [_t("cond_out", B, []), _t("acc_out", F, [2]), _t("scan", F, [2])],
        [
            helper.make_tensor("one", F, [], [1.0]),
            helper.make_tensor("limit", F, [], [20.0]),
        ],
    )
    node = helper.make_node(
        "Loop", ["M" if with_m else "", "cond" if with_cond else "", "acc0"], ["acc", "scans"],
        body=body,
    )  # fmt: skip
    ins = [_t("x", F, [2]), _t("acc0", F, [2])]
    if with_m:
        ins.append(_t("M", I64, []))
    if with_cond:
        ins.append(_t("cond", B, []))
    return _model([node], ins, [_t("acc", F, None), _t("scans", F, None)])


@pytest.mark.parametrize(("with_m", "with_cond"), [(True, True), (False, True)])
def test_loop_trip_count_cond_scan_outputs(with_m: bool, with_cond: bool) -> None:
    model = _loop_model(with_m, with_cond)
    feeds: dict[str, Any] = {
        "x": np.array([1.0, 2.0], np.float32),
        "acc0": np.zeros(2, np.float32),
    }
    if with_m:
        feeds["M"] = np.array(6, np.int64)
    if with_cond:
        feeds["cond"] = np.array(True)
    got, exp = _both(model, feeds)
    for g, e in zip(got, exp, strict=True):
        _assert_same(g, e)


def test_loop_without_cond_input_ignores_body_cond() -> None:
    # The spec's "for loop" mode: the body's cond output is ignored, all M trips run
    # (onnxruntime stops when the body's cond turns false; we follow the spec).
    model = _loop_model(True, False)
    x = np.array([1.0, 2.0], np.float32)
    feeds = {"x": x, "acc0": np.zeros(2, np.float32), "M": np.array(6, np.int64)}
    acc, scans = tfrt_py.model.load(model).run(feeds).values()
    expected = np.cumsum([x * (i + 1) for i in range(6)], axis=0)
    np.testing.assert_allclose(scans, expected)
    np.testing.assert_allclose(acc, expected[-1])


def test_loop_zero_trips_gives_empty_scan_output() -> None:
    model = _loop_model(True, True)
    feeds = {
        "x": np.ones(2, np.float32),
        "acc0": np.full(2, 3.0, np.float32),
        "M": np.array(0, np.int64),
        "cond": np.array(True),
    }
    acc, scans = tfrt_py.model.load(model).run(feeds).values()
    np.testing.assert_array_equal(acc, feeds["acc0"])
    assert scans.shape == (0, 2) and scans.dtype == np.float32


def test_scan9_axes_and_directions() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "a"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "b"], ["y"]),
        ],
        "body",
        [_t("s_in", F, [3]), _t("a", F, [3]), _t("b", F, [3])],
        [_t("s_out", F, [3]), _t("y", F, [3])],
    )
    node = helper.make_node(
        "Scan", ["s0", "A", "Bt"], ["s", "Y"], body=body, num_scan_inputs=2,
        scan_input_axes=[1, 0], scan_input_directions=[1, 0],
        scan_output_axes=[-1], scan_output_directions=[1],
    )  # fmt: skip
    model = _model(
        [node],
        [_t("s0", F, [3]), _t("A", F, [3, 4]), _t("Bt", F, [4, 3])],
        [_t("s", F, None), _t("Y", F, None)],
    )
    rng = np.random.default_rng(0)
    feeds = {
        "s0": rng.standard_normal(3).astype(np.float32),
        "A": rng.standard_normal((3, 4)).astype(np.float32),
        "Bt": rng.standard_normal((4, 3)).astype(np.float32),
    }
    got, exp = _both(model, feeds)
    for g, e in zip(got, exp, strict=True):
        _assert_same(g, e)


def test_if_multiple_outputs_with_captured_values() -> None:
    def branch(op: str) -> Any:
        return helper.make_graph(
            [helper.make_node(op, ["x", "y"], ["r"]), helper.make_node("Neg", ["r"], ["n"])],
            op,
            [],
            [_t("r", F, [2]), _t("n", F, [2])],
        )

    node = helper.make_node(
        "If", ["c"], ["r", "n"], then_branch=branch("Add"), else_branch=branch("Sub")
    )
    model = _model(
        [node], [_t("c", B, []), _t("x", F, [2]), _t("y", F, [2])], [_t("r", F), _t("n", F)]
    )
    x, y = np.array([1.0, 2.0], np.float32), np.array([5.0, 7.0], np.float32)
    for c in (True, False):
        got, exp = _both(model, {"c": np.array(c), "x": x, "y": y})
        for g, e in zip(got, exp, strict=True):
            _assert_same(g, e)


def _seq_model(nodes: list, inputs: list, out_elem: int = F) -> Any:
    seq_out = helper.make_tensor_sequence_value_info("out", out_elem, None)
    return _model(nodes, inputs, [seq_out])


@pytest.mark.parametrize(
    ("split", "keepdims"), [(None, 0), (None, 1), (np.array(2, np.int64), 1), ([1, 3], 0)]
)
def test_split_to_sequence_then_erase_insert(split: Any, keepdims: int) -> None:
    feeds: dict[str, Any] = {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}
    ins = ["x"]
    inputs = [_t("x", F, [3, 4])]
    if split is not None:
        feeds["split"] = np.asarray(split, np.int64)
        ins.append("split")
        inputs.append(_t("split", I64, None))
    nodes = [
        helper.make_node("SplitToSequence", ins, ["s"], axis=-1, keepdims=keepdims),
        helper.make_node("SequenceErase", ["s", "m1"], ["s2"]),
        helper.make_node("SequenceAt", ["s", "zero"], ["first"]),
        helper.make_node("SequenceInsert", ["s2", "first", "m1"], ["out"]),
    ]
    consts = [
        helper.make_node("Constant", [], ["m1"], value_int=-1),
        helper.make_node("Constant", [], ["zero"], value_int=0),
    ]
    got, exp = _both(_seq_model(consts + nodes, inputs), feeds)
    _assert_same(got[0], exp[0])


@pytest.mark.parametrize("new_axis", [0, 1])
def test_concat_from_sequence_and_length(new_axis: int) -> None:
    nodes = [
        helper.make_node("SequenceConstruct", ["a", "b", "a"], ["s"]),
        helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=-1, new_axis=new_axis),
        helper.make_node("SequenceLength", ["s"], ["n"]),
    ]
    model = _model(
        nodes, [_t("a", F, [2, 3]), _t("b", F, [2, 3])], [_t("y", F, None), _t("n", I64, None)]
    )
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal((2, 3)).astype(np.float32) for k in "ab"}
    got, exp = _both(model, feeds)
    for g, e in zip(got, exp, strict=True):
        _assert_same(g, e)


def test_sequence_map_with_tensor_input_and_two_outputs() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Add", ["e", "t"], ["s"]),
            helper.make_node("Shape", ["e"], ["sh"]),
        ],
        "body",
        [_t("e", F, None), _t("t", F, None)],
        [_t("s", F, None), _t("sh", I64, None)],
    )
    nodes = [
        helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=0),
        helper.make_node("SequenceMap", ["seq", "t"], ["sums", "shapes"], body=body),
    ]
    model = _model(
        nodes,
        [_t("x", F, [5, 2]), _t("split", I64, [2]), _t("t", F, [2])],
        [
            helper.make_tensor_sequence_value_info("sums", F, None),
            helper.make_tensor_sequence_value_info("shapes", I64, None),
        ],
    )
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    t = np.array([10.0, 20.0], np.float32)
    feeds = {"x": x, "split": np.array([2, 3], np.int64), "t": t}
    sums, shapes = tfrt_py.model.load(model).run(feeds).values()
    _assert_same(sums, [x[:2] + t, x[2:] + t])
    _assert_same(shapes, [np.array([2, 2]), np.array([3, 2])])


def test_optional_ops() -> None:
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
    nodes = [
        helper.make_node("Optional", ["x"], ["o"]),
        helper.make_node("OptionalHasElement", ["o"], ["has"]),
        helper.make_node("OptionalGetElement", ["o"], ["y"]),
        helper.make_node("Optional", [], ["empty"], type=seq_t),
        helper.make_node("OptionalHasElement", ["empty"], ["has_empty"]),
    ]
    model = _model(
        nodes,
        [_t("x", F, [2])],
        [_t("has", B, []), _t("y", F, [2]), _t("has_empty", B, [])],
        opset=18,
    )
    got, exp = _both(model, {"x": np.array([1.0, 2.0], np.float32)})
    for g, e in zip(got, exp, strict=True):
        _assert_same(g, e)


@pytest.mark.parametrize("with_lens", [True, False])
def test_scan8_batch_sequence_lens_reverse(with_lens: bool) -> None:
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "a"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "a"], ["y"]),
        ],
        "body",
        [_t("s_in", F, [2]), _t("a", F, [2])],
        [_t("s_out", F, [2]), _t("y", F, [2])],
    )
    node = helper.make_node(
        "Scan", ["L" if with_lens else "", "s0", "x"], ["s", "Y"], body=body,
        num_scan_inputs=1, directions=[1],
    )  # fmt: skip
    inputs = [_t("s0", F, [3, 2]), _t("x", F, [3, 4, 2])]
    rng = np.random.default_rng(0)
    feeds = {
        "s0": rng.standard_normal((3, 2)).astype(np.float32),
        "x": rng.standard_normal((3, 4, 2)).astype(np.float32),
    }
    if with_lens:
        inputs.append(_t("L", I64, [3]))
        feeds["L"] = np.array([4, 2, 3], np.int64)
    model = _model([node], inputs, [_t("s", F, None), _t("Y", F, None)], opset=8)
    model.ir_version = 4
    got, exp = _both(model, feeds)
    for g, e in zip(got, exp, strict=True):
        _assert_same(g, e)
