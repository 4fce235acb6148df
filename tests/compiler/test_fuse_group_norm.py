"""fuse_vision's GroupNorm: torch's opset-17 export of ``nn.GroupNorm`` (Reshape to (N, G,
-1), InstanceNormalization with unit scale, Reshape to the input's Shape, Mul and Add by
per-channel constants, an optional Relu) as one ``tfrt_py.fused::GroupNorm``
(kernels/nn/norm_group_jit.py), against onnxruntime on the compiled and the NumPy paths;
and the near misses that must stay apart."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.jit_paths import spy_compiled

_RNG = np.random.default_rng(17)


def _gn_model(
    shape: tuple[int, ...], groups: int, relu: bool, in_scale: float = 1.0,
    extra_reader: bool = False,
) -> tuple[onnx.ModelProto, np.ndarray]:  # fmt: skip
    """x -> GroupNorm(groups) -> (Relu) -> y, as torch.onnx writes it at opset 17."""
    c = shape[1]
    affine = (c,) + (1,) * (len(shape) - 2)
    inits: dict[str, np.ndarray] = {
        "to_groups": np.array([0, groups, -1], np.int64),
        "ones": np.full(groups, in_scale, np.float32),
        "zeros": np.zeros(groups, np.float32),
        "gamma": _RNG.standard_normal(affine).astype(np.float32),
        "beta": _RNG.standard_normal(affine).astype(np.float32),
    }
    mk = helper.make_node
    nodes = [
        mk("Reshape", ["x", "to_groups"], ["r1"]),
        mk("InstanceNormalization", ["r1", "ones", "zeros"], ["n"], epsilon=1e-5),
        mk("Shape", ["x"], ["sh"]),
        mk("Reshape", ["n", "sh"], ["r2"]),
        mk("Mul", ["r2", "gamma"], ["m"]),
        mk("Add", ["m", "beta"], ["a" if relu else "y"]),
    ]
    outs = ["y"]
    if relu:
        nodes.append(mk("Relu", ["a"], ["y"]))
    if extra_reader:
        nodes.append(mk("Neg", ["n"], ["side"]))
        outs.append("side")
    g = helper.make_graph(
        nodes, "gn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    x = (_RNG.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), x


def _check(m: onnx.ModelProto, x: np.ndarray) -> tfrt_py.Model:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    model = tfrt_py.load(m, executor="sync")
    for _ in range(2):  # the probe, then the planned code
        got = model.run({"x": x})
        for w, g in zip(want, got.values()):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    return model


@pytest.mark.parametrize(
    ("shape", "groups", "relu"),
    [((1, 256, 20, 20), 32, True), ((2, 64, 7, 9), 8, False), ((1, 6, 5, 4), 4, True),
     ((3, 32, 50), 4, False)],
    ids=str,
)  # fmt: skip
def test_group_norm_is_one_kernel(
    jit: str, monkeypatch: pytest.MonkeyPatch, shape: Any, groups: int, relu: bool
) -> None:
    """RetinaNet's head shape, a batch, groups that end inside a channel (6 channels in 4
    groups), rank 3."""
    from tfrt_py.kernels.fused import vision

    ran = spy_compiled(monkeypatch, vision, "group_norm_kernel")
    m, x = _gn_model(shape, groups, relu)
    model = _check(m, x)
    ops = [n.op_type for n in model.prepared.graph.nodes]
    assert "GroupNorm" in ops and "InstanceNormalization" not in ops and "Relu" not in ops, ops
    assert bool(ran) == (jit == "jit"), "the compiled kernel runs exactly when numba may"


def test_a_near_miss_stays_apart() -> None:
    """An InstanceNormalization with a scale other than 1, or whose output is read
    elsewhere, is not torch's GroupNorm: the graph keeps it, same values."""
    for m, x in (_gn_model((1, 16, 6, 6), 4, True, in_scale=2.0),
                 _gn_model((1, 16, 6, 6), 4, True, extra_reader=True)):  # fmt: skip
        model = _check(m, x)
        ops = [n.op_type for n in model.prepared.graph.nodes]
        assert "GroupNorm" not in ops and "InstanceNormalization" in ops, ops
