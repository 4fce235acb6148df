"""fuse_conv's residual Add where the dims are not numbers: a CNN exported with dynamic
height and width names every conv output's dims afresh (``unk__7``), so the residual's type
never equals the conv's by name; the Add is fused when dtype, rank and the known dims agree,
and the kernel broadcasts a residual of another shape at run time (either way). Against
onnxruntime, at two input sizes, on the probe and the planned calls."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py

_RNG = np.random.default_rng(23)


def _block(kernel: int, r_dims: list[str | int]) -> onnx.ModelProto:
    """x [1, 8, h, w] -> Conv(8 -> 8, kernel, same padding) -> Add(., r) -> Relu."""
    w = _RNG.standard_normal((8, 8, kernel, kernel)).astype(np.float32) * 0.3
    b = _RNG.standard_normal(8).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[kernel // 2] * 4),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "h", "w"]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, r_dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("kernel", "r_dims", "sizes"),
    [
        (3, [1, 8, "p", "q"], [((9, 11), (9, 11)), ((16, 5), (16, 5))]),  # a skip connection
        (3, [1, 8, "p", "q"], [((6, 7), (1, 1)), ((6, 7), (6, 1))]),  # r broadcasts into y
        (1, [1, 8, "p", "q"], [((1, 1), (4, 5)), ((1, 5), (3, 5))]),  # r broadcasts y up
    ],
)
def test_a_residual_of_unnamed_dims_is_fused_and_broadcast_at_run_time(
    kernel: int, r_dims: list[str | int], sizes: list[tuple[tuple[int, int], tuple[int, int]]]
) -> None:
    m = _block(kernel, r_dims)
    model = tfrt_py.load(m, executor="sync")
    report = next(r.summary for r in model.prepared.reports if r.name == "fuse_conv")
    assert "1 residual Adds" in report, report
    assert [n.op_type for n in model.prepared.graph.nodes] == ["Conv"]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for xs, rs in sizes:
        feeds = {"x": _RNG.standard_normal((1, 8, *xs)).astype(np.float32),
                 "r": _RNG.standard_normal((1, 8, *rs)).astype(np.float32)}  # fmt: skip
        (want,) = sess.run(None, feeds)
        for _ in range(2):  # the probe, then the planned code
            np.testing.assert_allclose(model.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)


def test_a_residual_of_another_rank_stays_apart() -> None:
    """A rank-3 operand broadcast over the batch is not a residual the kernel takes: the
    Add stays a node (the Relu then too), same values."""
    m = _block(3, [8, "p", "q"])
    model = tfrt_py.load(m, executor="sync")
    report = next(r.summary for r in model.prepared.reports if r.name == "fuse_conv")
    assert "residual" not in report or "0 residual Adds" in report, report
    assert "Add" in [n.op_type for n in model.prepared.graph.nodes]
    feeds = {"x": _RNG.standard_normal((1, 8, 5, 6)).astype(np.float32),
             "r": _RNG.standard_normal((8, 5, 6)).astype(np.float32)}  # fmt: skip
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        model.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-5, atol=1e-5
    )
