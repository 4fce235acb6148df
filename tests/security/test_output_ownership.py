"""Issue 12: what a call hands back is the caller's own, and what it takes is read as given.

Every executor returns fresh arrays that share memory with no feed, no constant and no
other output (a pass-through model must not hand the caller their own array back);
``outputs=`` buffers that overlap a feed are refused; ndarray subclasses are read as plain
arrays; a one-output Split yields an array, not a 1-tuple.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.support.executors import load_on
from tfrt_py.errors import InputError


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: Sequence[Any] = (),
           opset: int = 17) -> bytes:  # fmt: skip
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _info(name: str, shape: Any, dtype: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


X = _info("x", [2, 3])
Y = _info("y", [2, 3])
x0 = np.arange(6, dtype=np.float32).reshape(2, 3) + 1


def _then_else(then_out: Any, else_out: Any) -> list[Any]:
    then_g = helper.make_graph(then_out[0], "then", [], [_info(then_out[1], [2, 3])])
    else_g = helper.make_graph(else_out[0], "else", [], [_info(else_out[1], [2, 3])])
    return [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]


PASS_THROUGH = {
    "identity": ([helper.make_node("Identity", ["x"], ["y"])], []),
    "cast-same-dtype": ([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], []),
    "expand-same-shape": (
        [helper.make_node("Expand", ["x", "s"], ["y"])],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "s")],
    ),
    "reshape-view": (
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "s")],
    ),
}


@pytest.mark.parametrize("case", sorted(PASS_THROUGH))
def test_pass_through_output_is_not_the_feed(case: str, executor: str) -> None:
    nodes, inits = PASS_THROUGH[case]
    model = load_on(executor, _model(nodes, [X], [Y], inits))
    for _ in range(3):  # the first call, then the planned / compiled path
        x = x0.copy()
        y = model.run({"x": x})["y"]
        np.testing.assert_array_equal(y, x0)
        assert not np.shares_memory(y, x)
        y[...] = -1  # the caller owns y: writing it changes nothing of theirs or ours
        np.testing.assert_array_equal(x, x0)


def _if_model(then_returns_feed: bool) -> bytes:
    neg = helper.make_node("Neg", ["x"], ["nx"])
    if then_returns_feed:
        nodes = _then_else(([helper.make_node("Identity", ["x"], ["t"])], "t"), ([neg], "nx"))
    else:
        k = numpy_helper.from_array(np.full((2, 3), 7, np.float32), "k")
        const = helper.make_node("Constant", [], ["t"], value=k)
        nodes = _then_else(([const], "t"), ([neg], "nx"))
    c = _info("c", [], TensorProto.BOOL)
    return _model(nodes, [c, X], [Y])


def test_if_branch_returning_the_feed_is_copied(executor: str) -> None:
    model = load_on(executor, _if_model(True))
    for _ in range(3):
        x = x0.copy()
        y = model.run({"c": np.array(True), "x": x})["y"]
        assert not np.shares_memory(y, x)
        np.testing.assert_array_equal(y, x0)


def test_if_branch_constant_cannot_be_written_through(executor: str) -> None:
    model = load_on(executor, _if_model(False))
    for _ in range(3):
        y = model.run({"c": np.array(True), "x": x0})["y"]
        np.testing.assert_array_equal(y, np.full((2, 3), 7, np.float32))
        y[...] = -1  # must not poison the model's constant for the next call


def test_zero_trip_loop_returning_the_feed_is_copied(executor: str) -> None:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Neg", ["v_in"], ["v_out"]),
        ],
        "body",
        [_info("i", [], TensorProto.INT64), _info("cond_in", [], TensorProto.BOOL),
         _info("v_in", [2, 3])],
        [_info("cond_out", [], TensorProto.BOOL), _info("v_out", [2, 3])],
    )  # fmt: skip
    loop = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)
    model = load_on(executor, _model([loop], [_info("n", [], TensorProto.INT64), X], [Y]))
    for _ in range(3):
        x = x0.copy()
        y = model.run({"n": np.array(0, np.int64), "x": x})["y"]
        assert not np.shares_memory(y, x)
        np.testing.assert_array_equal(y, x0)


def test_two_outputs_are_two_arrays(executor: str) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["y"], ["y2"])]
    model = load_on(executor, _model(nodes, [X], [Y, _info("y2", [2, 3])]))
    for _ in range(3):
        out = model.run({"x": x0})
        assert not np.shares_memory(out["y"], out["y2"])
        out["y"][...] = -1
        np.testing.assert_array_equal(out["y2"], x0)


def test_output_buffer_overlapping_a_feed_is_refused(executor: str) -> None:
    """Relu(x*W)+x fuses into one kernel on sync: writing y into x's memory while the
    kernel still reads x gave wrong results."""
    w = numpy_helper.from_array(np.full((3, 3), 0.5, np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Relu", ["xw"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["y"]),
    ]
    model = load_on(executor, _model(nodes, [X], [Y], [w]))
    want = model.run({"x": x0})["y"]
    x = x0.copy()
    with pytest.raises(InputError, match="shares memory with feed"):
        model.run({"x": x}, outputs={"y": x})
    with pytest.raises(InputError, match="shares memory with feed"):
        model.run({"x": x}, outputs={"y": x.reshape(3, 2).reshape(2, 3)})
    np.testing.assert_array_equal(x, x0)  # refused before anything was written
    buf = np.empty((2, 3), np.float32)
    np.testing.assert_allclose(model.run({"x": x}, outputs={"y": buf})["y"], want)
    np.testing.assert_allclose(buf, want)


def _cache_model() -> bytes:
    """A KV cache's shape: present = Concat(past, new) along axis 1, read by a product."""
    nodes = [
        helper.make_node("Concat", ["past", "new"], ["present"], axis=1),
        helper.make_node("ReduceSum", ["present", "axes"], ["total"], keepdims=0),
    ]
    ins = [_info("past", [2, "p"]), _info("new", [2, 1])]
    outs = [_info("present", [2, "t"]), _info("total", [2])]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    return _model(nodes, ins, outs, [axes], opset=13)


def test_a_concat_output_buffer_may_start_with_its_first_feed(executor: str) -> None:
    """The generation's in-place cache: the present buffer starts with the past feed (the
    same memory); the model writes the new column after it, the past stays as it was."""
    model = load_on(executor, _cache_model())
    buf = np.zeros((2, 6), np.float32)
    for p in range(5):
        past, new = buf[:, :p], np.full((2, 1), p + 1.0, np.float32)
        want = np.concatenate([past, new], axis=1)
        out = model.run({"past": past, "new": new}, outputs={"present": buf[:, : p + 1]})
        np.testing.assert_array_equal(out["present"], want)
        np.testing.assert_array_equal(out["total"], want.sum(axis=1))
        assert np.shares_memory(out["present"], buf)
    np.testing.assert_array_equal(buf[0], [1, 2, 3, 4, 5, 0])


def test_a_concat_buffer_that_holds_its_feed_elsewhere_is_refused(executor: str) -> None:
    model = load_on(executor, _cache_model())
    buf = np.zeros((2, 6), np.float32)
    new = np.ones((2, 1), np.float32)
    with pytest.raises(InputError, match="shares memory with feed"):  # past not at the start
        model.run({"past": buf[:, 1:3], "new": new}, outputs={"present": buf[:, :3]})
    with pytest.raises(InputError, match="shares memory with feed"):  # the second operand
        model.run({"past": np.zeros((2, 2), np.float32), "new": buf[:, :1]},
                  outputs={"present": buf[:, :3]})  # fmt: skip
    with pytest.raises(InputError, match="shares memory with feed"):  # another output
        outs = {"present": np.zeros((2, 3), np.float32), "total": buf[:, 0]}
        model.run({"past": buf[:, :2], "new": new}, outputs=outs)


@pytest.mark.parametrize(
    ("buf", "what"),
    [("read-only", "read-only"), ("list", "got list")],
)
def test_bad_output_buffers_are_input_errors(executor: str, buf: str, what: str) -> None:
    model = load_on(executor, _model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y]))
    b: Any = [[0.0] * 3] * 2
    if buf == "read-only":
        b = np.zeros((2, 3), np.float32)
        b.flags.writeable = False
    with pytest.raises(InputError, match=what):
        model.run({"x": x0}, outputs={"y": b})
    np.testing.assert_array_equal(model.run({"x": x0})["y"], x0)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_matrix_feed_is_read_as_an_array(executor: str, request: pytest.FixtureRequest) -> None:
    """np.matrix keeps two dims under reductions: a ReduceSum(keepdims=0) gave (1, 1)."""
    node = helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)
    model = load_on(executor, _model([node], [X], [_info("y", [])], opset=11))
    for _ in range(2):
        got = model.run({"x": np.matrix(x0)})["y"]
        assert type(got) is np.ndarray and got.shape == ()
        assert got == x0.sum()


@pytest.mark.parametrize("opset", [13, 18])
def test_split_with_one_output(executor: str, opset: int) -> None:
    """A one-output Split returned a 1-tuple: the next Squeeze failed (torchvision's SSDLite
    export), and as a graph output it had a wrong shape (1, 2, 3) silently."""
    attrs: dict[str, Any] = {"num_outputs": 1} if opset >= 18 else {}
    split = helper.make_node("Split", ["x"], ["s"], axis=0, **attrs)
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    squeeze = helper.make_node("Unsqueeze", ["s", "axes"], ["y"])
    as_output = load_on(executor, _model([split], [X], [_info("s", [2, 3])], opset=opset))
    np.testing.assert_array_equal(as_output.run({"x": x0})["s"], x0)
    chained = load_on(
        executor, _model([split, squeeze], [X], [_info("y", [1, 2, 3])], [axes], opset=opset)
    )
    np.testing.assert_array_equal(chained.run({"x": x0})["y"], x0[None])
