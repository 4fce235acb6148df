"""The merge_branches pass (compiler/merge_branches.py): a sum of convs over one input --
KxK, 1x1, a BatchNormalization of the input, the input itself -- becomes one conv
(RepVGG's re-parameterization), checked against onnxruntime running the branches as
written; and the sums it must leave alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.one_input import one_input_model, ort_as_written

_RNG = np.random.default_rng(41)
mk = helper.make_node


def _summary(model: tfrt_py.Model) -> str:
    return next(r.summary for r in model.prepared.reports if r.name == "merge_branches")


def _f32(*shape: int, scale: float = 0.2) -> np.ndarray:
    return (_RNG.standard_normal(shape) * scale).astype(np.float32)


def _bn(c: int, prefix: str, var: np.ndarray | None = None) -> dict[str, np.ndarray]:
    v = np.abs(_f32(c, scale=1.0)) + 0.5 if var is None else var
    return {
        f"{prefix}s": _f32(c, scale=1.0),
        f"{prefix}b": _f32(c, scale=1.0),
        f"{prefix}m": _f32(c, scale=1.0),
        f"{prefix}v": v.astype(np.float32),
    }


def _check(m: onnx.ModelProto, x: np.ndarray, merged: bool) -> tfrt_py.Model:
    model = tfrt_py.load(m, executor="sync")
    want = ort_as_written(m, x)
    got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    convs = [n for n in model.prepared.graph.nodes if n.op_type == "Conv"]
    if merged:
        assert "merged into one conv" in _summary(model)
        assert len(convs) == 1, [n.op_type for n in model.prepared.graph.nodes]
    else:
        assert _summary(model) == "nothing to merge"
    return model


def _repvgg(c: int, m: int, stride: int, group: int = 1, identity: str = "bn") -> tuple[Any, ...]:
    """A RepVGG block as torch.onnx writes it: a 3x3 and a 1x1 conv of x, (a
    BatchNormalization of x, or x,) summed, then Relu."""
    cg = c // group
    inits = {"w3": _f32(m, cg, 3, 3), "b3": _f32(m), "w1": _f32(m, cg, 1, 1), "b1": _f32(m)}
    geo: dict[str, Any] = {"strides": [stride, stride], "group": group}
    nodes = [
        mk("Conv", ["x", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], **geo),
        mk("Conv", ["x", "w1", "b1"], ["c1"], pads=[0, 0, 0, 0], **geo),
        mk("Add", ["c1", "c3"], ["s"]),
    ]
    last = "s"
    if identity == "bn":
        inits.update(_bn(c, "n"))
        nodes += [
            mk("BatchNormalization", ["x", "ns", "nb", "nm", "nv"], ["id"], epsilon=1e-5),
            mk("Add", ["s", "id"], ["s2"]),
        ]
        last = "s2"
    elif identity == "x":
        nodes.append(mk("Add", ["x", "s"], ["s2"]))
        last = "s2"
    nodes.append(mk("Relu", [last], ["y"]))
    return nodes, inits


@pytest.mark.parametrize(
    ("c", "m", "stride", "group", "identity", "side"),
    [
        (16, 16, 1, 1, "bn", 14),
        (16, 16, 1, 1, "x", 9),
        (8, 24, 2, 1, "none", 15),  # RepVGG's first block of a stage: no identity
        (32, 32, 1, 32, "bn", 12),  # MobileOne's depthwise form
        (24, 24, 1, 4, "bn", 10),
    ],
)  # fmt: skip
def test_a_repvgg_block_is_one_conv(
    c: int, m: int, stride: int, group: int, identity: str, side: int
) -> None:
    nodes, inits = _repvgg(c, m, stride, group, identity)
    x = _f32(2, c, side, side, scale=1.0)
    model = _check(one_input_model(nodes, x, inits), x, merged=True)
    ops = [n.op_type for n in model.prepared.graph.nodes]
    assert ops == ["Conv"], ops  # fuse_conv took the Relu into the merged conv


def test_branches_with_their_own_batch_norms_merge() -> None:
    """The dynamo exporter keeps each conv's BatchNormalization: folded first, then
    merged; a 5x5 with a 3x3 and a 1x1 inside it."""
    c = 16
    inits = {"w5": _f32(c, c, 5, 5), "w3": _f32(c, c, 3, 3), "w1": _f32(c, c, 1, 1)}
    inits.update(_bn(c, "p"))
    inits.update(_bn(c, "q"))
    nodes = [
        mk("Conv", ["x", "w5"], ["c5"], pads=[2, 2, 2, 2]),
        mk("Conv", ["x", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        mk("BatchNormalization", ["c3", "ps", "pb", "pm", "pv"], ["n3"]),
        mk("Conv", ["x", "w1"], ["c1"]),
        mk("BatchNormalization", ["c1", "qs", "qb", "qm", "qv"], ["n1"]),
        mk("Add", ["c5", "n3"], ["s"]),
        mk("Add", ["n1", "s"], ["y"]),
    ]
    x = _f32(1, c, 11, 13, scale=1.0)
    _check(one_input_model(nodes, x, inits), x, merged=True)


def _two(pads1: list[int], pads3: list[int] | None = None, **extra: Any) -> tuple[Any, ...]:
    c = 16
    inits = {"w3": _f32(c, c, 3, 3), "w1": _f32(c, c, 1, 1)}
    nodes = [
        mk("Conv", ["x", "w3"], ["c3"], pads=pads3 or [1, 1, 1, 1]),
        mk("Conv", ["x", "w1"], ["c1"], pads=pads1, **extra),
        mk("Add", ["c3", "c1"], ["y"]),
    ]
    return nodes, inits


@pytest.mark.parametrize(
    ("pads3", "extra"),
    [
        # the 1x1 reads the 3x3's top-left tap, not its centre (both outputs 10x10)
        ([0, 0, 2, 2], {}),
        # a dilated 1x1 (the same taps, but dilation is left to the convs as they are)
        ([1, 1, 1, 1], {"dilations": [2, 2]}),
    ],
)
def test_misaligned_branches_stay_apart(pads3: list[int], extra: Any) -> None:
    nodes, inits = _two([0, 0, 0, 0], pads3, **extra)
    x = _f32(1, 16, 10, 10, scale=1.0)
    _check(one_input_model(nodes, x, inits), x, merged=False)


def test_a_negative_pad_is_not_merged_away() -> None:
    """A 1x1 with pads of -1 under a 3x3 with none would sit at its centre: the Conv
    kernel refuses negative pads, and the model must still be refused, not merged."""
    nodes, inits = _two([-1, -1, -1, -1], [0, 0, 0, 0])
    x = _f32(1, 16, 8, 8, scale=1.0)
    with pytest.raises(tfrt_py.errors.TfrtError, match="negative pads"):
        tfrt_py.load(one_input_model(nodes, x, inits), executor="sync")


def test_a_branch_read_elsewhere_stays_apart() -> None:
    """The 1x1's output is also a graph output: the sum may not take it."""
    nodes, inits = _two([0, 0, 0, 0])
    x = _f32(1, 16, 8, 8, scale=1.0)
    m = one_input_model(nodes, x, inits)
    m.graph.output.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, None))
    model = tfrt_py.load(m, executor="sync")
    assert _summary(model) == "nothing to merge"
    got = model.run({"x": x})
    np.testing.assert_allclose(got["y"], ort_as_written(m, x), rtol=1e-5, atol=1e-5)


def test_branches_over_different_inputs_stay_apart() -> None:
    c = 8
    inits = {"w3": _f32(c, c, 3, 3), "w1": _f32(c, c, 1, 1)}
    nodes = [
        mk("Relu", ["x"], ["r"]),
        mk("Conv", ["x", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        mk("Conv", ["r", "w1"], ["c1"]),
        mk("Add", ["c3", "c1"], ["y"]),
    ]
    x = _f32(1, c, 6, 6, scale=1.0)
    _check(one_input_model(nodes, x, inits), x, merged=False)


def test_a_batch_norm_identity_with_an_infinite_scale_stays_apart() -> None:
    """A variance of -epsilon gives the BatchNormalization an infinite scale: folded into
    the centre tap it would mix +inf and -inf into NaN over the other taps' products."""
    c = 8
    nodes, inits = _repvgg(c, c, 1)
    var = np.abs(_f32(c, scale=1.0)) + 0.5
    var[3] = -1e-5
    inits.update(_bn(c, "n", var=var))
    x = _f32(1, c, 6, 6, scale=1.0)
    m = one_input_model(nodes, x, inits)
    model = tfrt_py.load(m, executor="sync")
    # the two convs still merge; the BatchNormalization stays a node of its own
    assert _summary(model) == "1 sums of 2 conv branches merged into one conv each"
    ops = {n.op_type for n in model.prepared.graph.nodes}
    assert ops & {"BatchNormalization", "BatchNormAct"}, ops
    np.testing.assert_allclose(model.run({"x": x})["y"], ort_as_written(m, x), rtol=1e-5, atol=1e-5)
