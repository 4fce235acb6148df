"""The fuse_vision pass (compiler/fuse_vision.py) and its kernels: ConvNeXt's
Transpose -> LayerNormalization -> Transpose as one channel LayerNorm
(kernels/nn/norm_channel.py), and an erf GELU as a Conv's epilogue. Checked against
onnxruntime, on the compiled and the NumPy paths."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.one_input import ort_as_written
from tfrt_py.compiler.pipeline import PASSES
from tfrt_py.kernels.nn import norm_affine
from tfrt_py.kernels.nn.norm_channel import SPLIT_MIN_ELEMENTS, channel_layer_norm

_RNG = np.random.default_rng(5)
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _model(
    nodes: list[onnx.NodeProto], x: np.ndarray, inits: dict[str, np.ndarray], opset: int = 17
) -> onnx.ModelProto:
    t = _ELEM[x.dtype]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", t, x.shape)],
        [helper.make_tensor_value_info("y", t, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


_ort = ort_as_written


def _summary(model: tfrt_py.Model) -> str:
    return next(r.summary for r in model.prepared.reports if r.name == "fuse_vision")


def _ln_nodes(rank: int, bias: bool, mid_perm: list[int] | None = None) -> list[Any]:
    last = [0, *range(2, rank), 1]
    back = [0, rank - 1, *range(1, rank - 1)]
    mk = helper.make_node
    return [
        mk("Transpose", ["x"], ["t"], perm=mid_perm or last),
        mk("LayerNormalization", ["t", "g", "b"] if bias else ["t", "g"], ["n"], epsilon=1e-6),
        mk("Transpose", ["n"], ["y"], perm=back),
    ]


@pytest.mark.parametrize(
    "shape", [(1, 40, 56, 56), (2, 24, 7, 9), (1, 16, 300), (1, 8, 3, 4, 5)], ids=str
)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.compiles
def test_channel_layer_norm_matches_onnxruntime(jit: str, shape: Any, bias: bool) -> None:
    """Rank 3 to 5, batches, with and without bias; (1, 40, 56, 56) is above the split
    threshold (its pixels run on the intra-op threads)."""
    x = (_RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    c = shape[1]
    inits = {"g": _RNG.standard_normal(c).astype(np.float32)}
    if bias:
        inits["b"] = _RNG.standard_normal(c).astype(np.float32)
    m = _model(_ln_nodes(len(shape), bias), x, inits)
    model = tfrt_py.load(m, executor="sync")
    assert _summary(model) == (
        "1 channel LayerNorms, 0 Conv+GELU, 0 squeeze-and-excite, 0 GroupNorms, "
        "0 BatchNormalization+activation, 0 BatchNormalization folded into a product"
    )
    ops = [n.op_type for n in model.prepared.graph.nodes]
    assert ops == ["ChannelLayerNorm"], ops
    want = _ort(m, x)
    for _ in range(2):
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    out = np.full(want.shape, np.nan, np.float32)
    assert model.run({"x": x}, outputs={"y": out})["y"] is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    if shape == (1, 40, 56, 56):
        assert x.size >= SPLIT_MIN_ELEMENTS


def test_channel_layer_norm_float64_and_strided_input() -> None:
    """float64 takes NumPy's two passes; a non-contiguous input is copied first."""
    x = _RNG.standard_normal((2, 6, 5, 5))
    g, b = _RNG.standard_normal(6), _RNG.standard_normal(6)
    d = x - x.mean(axis=1, keepdims=True)
    want = d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5) * g[:, None, None]
    want += b[:, None, None]
    np.testing.assert_allclose(channel_layer_norm(x, g, b, 1e-5), want, rtol=1e-12)
    xs = x.astype(np.float32)[:, :, ::2, :]
    ws = want[:, :, ::2, :]  # each pixel's norm is its own: a strided view of the same
    got = channel_layer_norm(xs, g.astype(np.float32), b.astype(np.float32), 1e-5)
    np.testing.assert_allclose(got, ws, rtol=1e-4, atol=1e-5)


def test_other_transposes_are_not_fused() -> None:
    """A perm that does not move the channels last, or a LayerNorm value read twice,
    keeps the three nodes."""
    x = _RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    inits = {"g": np.ones(6, np.float32), "b": np.zeros(6, np.float32)}
    nodes = _ln_nodes(4, True, mid_perm=[0, 1, 3, 2])
    nodes[2].attribute[0].ints[:] = [0, 1, 3, 2]
    m = _model(nodes, x, inits)
    model = tfrt_py.load(m)
    assert _summary(model) == "nothing to fuse"
    np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-5, atol=1e-5)


def _gelu_nodes(pre: str) -> list[onnx.NodeProto]:
    """erf GELU as torch.onnx writes it."""
    mk = helper.make_node

    def const(name: str, v: float) -> onnx.NodeProto:
        return mk("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.float32)))

    return [
        const("s2", math.sqrt(2.0)), const("one", 1.0), const("half", 0.5),
        mk("Div", [pre, "s2"], ["d"]), mk("Erf", ["d"], ["e"]), mk("Add", ["e", "one"], ["a"]),
        mk("Mul", [pre, "a"], ["m"]), mk("Mul", ["m", "half"], ["y"]),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "group"),
    [
        ((1, 40, 56, 56), (160, 40, 1, 1), 1),  # ConvNeXt's fc1: blocks of rows, split
        ((1, 8, 12, 12), (16, 8, 3, 3), 1),
        ((1, 16, 10, 10), (16, 4, 3, 3), 4),
    ],
)
def test_conv_gelu_runs_in_the_epilogue(jit: str, x_shape: Any, w_shape: Any, group: int) -> None:
    x = _RNG.standard_normal(x_shape).astype(np.float32)
    inits = {"w": (_RNG.standard_normal(w_shape) * 0.3).astype(np.float32),
             "b": _RNG.standard_normal(w_shape[0]).astype(np.float32)}  # fmt: skip
    pads = [w_shape[2] // 2] * 4
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads, group=group)
    m = _model([conv, *_gelu_nodes("c")], x, inits)
    model = tfrt_py.load(m, executor="sync")
    assert _summary(model) == (
        "0 channel LayerNorms, 1 Conv+GELU, 0 squeeze-and-excite, 0 GroupNorms, "
        "0 BatchNormalization+activation, 0 BatchNormalization folded into a product"
    )
    (node,) = model.prepared.graph.nodes
    assert node.attrs["activation"] == "Gelu"
    want = _ort(m, x)
    for _ in range(2):
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    off = tfrt_py.load(m, optimize=set(PASSES) - {"fuse_vision"})
    assert len(off.prepared.graph.nodes) == 2
    np.testing.assert_allclose(off.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_a_tanh_gelu_stays_out_of_the_conv() -> None:
    """Only the erf form is an epilogue: a Gelu(approximate=tanh) node keeps its own."""
    x = _RNG.standard_normal((1, 4, 8, 8)).astype(np.float32)
    inits = {"w": _RNG.standard_normal((4, 4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Gelu", ["c"], ["y"], approximate="tanh")]  # fmt: skip
    m = _model(nodes, x, inits, opset=20)
    model = tfrt_py.load(m)
    assert [n.op_type for n in model.prepared.graph.nodes] == ["Conv", "Gelu"]
    np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-5, atol=1e-5)


def _se_nodes(act1: str, gate: str, x_first: bool) -> list[onnx.NodeProto]:
    mk = helper.make_node
    nodes = [mk("GlobalAveragePool", ["x"], ["g"]), mk("Conv", ["g", "w1", "b1"], ["c1"])]
    if act1 == "SiLU":  # EfficientNet's: x * sigmoid(x), which fuse_transformer names
        nodes += [mk("Sigmoid", ["c1"], ["s1"]), mk("Mul", ["c1", "s1"], ["h"])]
    else:
        nodes.append(mk(act1, ["c1"], ["h"]))
    nodes.append(mk("Conv", ["h", "w2", "b2"], ["c2"]))
    gate_attrs: dict[str, Any] = {"alpha": 1 / 6} if gate == "HardSigmoid" else {}
    nodes.append(mk(gate, ["c2"], ["s"], **gate_attrs))
    nodes.append(mk("Mul", ["x", "s"] if x_first else ["s", "x"], ["y"]))
    return nodes


@pytest.mark.parametrize(
    ("act1", "gate", "shape"),
    [
        ("Relu", "HardSigmoid", (1, 96, 14, 14)),  # MobileNet v3
        ("SiLU", "Sigmoid", (2, 40, 28, 28)),  # EfficientNet
        ("Relu", "Sigmoid", (1, 48, 7, 9)),  # RegNetY
        ("SiLU", "Sigmoid", (1, 96, 56, 56)),  # split over native threads when there
    ],
)
@pytest.mark.parametrize("x_first", [True, False])
def test_squeeze_excite_is_one_kernel(
    jit: str, act1: str, gate: str, shape: Any, x_first: bool
) -> None:
    x = _RNG.standard_normal(shape).astype(np.float32)
    c, r = shape[1], shape[1] // 4
    inits = {"w1": (_RNG.standard_normal((r, c, 1, 1)) * 0.3).astype(np.float32),
             "b1": _RNG.standard_normal(r).astype(np.float32),
             "w2": (_RNG.standard_normal((c, r, 1, 1)) * 0.3).astype(np.float32),
             "b2": _RNG.standard_normal(c).astype(np.float32)}  # fmt: skip
    m = _model(_se_nodes(act1, gate, x_first), x, inits)
    model = tfrt_py.load(m, executor="sync")
    assert _summary(model) == (
        "0 channel LayerNorms, 0 Conv+GELU, 1 squeeze-and-excite, 0 GroupNorms, "
        "0 BatchNormalization+activation, 0 BatchNormalization folded into a product"
    )
    assert [n.op_type for n in model.prepared.graph.nodes] == ["SqueezeExcite"]
    want = _ort(m, x)
    for _ in range(2):
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    out = np.full(want.shape, np.nan, np.float32)
    assert model.run({"x": x}, outputs={"y": out})["y"] is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def _se_with_mean(opset: int, axes: list[int], keepdims: int) -> tuple[Any, ...]:
    """The MobileNet v3 block with its mean as ``ReduceMean`` (the dynamo exporter's):
    axes an attribute before opset 18, a constant input from it."""
    x = _RNG.standard_normal((2, 24, 9, 7)).astype(np.float32)
    inits = {"w1": (_RNG.standard_normal((6, 24, 1, 1)) * 0.3).astype(np.float32),
             "b1": _RNG.standard_normal(6).astype(np.float32),
             "w2": (_RNG.standard_normal((24, 6, 1, 1)) * 0.3).astype(np.float32),
             "b2": _RNG.standard_normal(24).astype(np.float32)}  # fmt: skip
    nodes = _se_nodes("Relu", "HardSigmoid", True)
    if opset >= 18:
        inits["axes"] = np.array(axes, np.int64)
        mean = helper.make_node("ReduceMean", ["x", "axes"], ["g"], keepdims=keepdims)
    else:
        mean = helper.make_node("ReduceMean", ["x"], ["g"], axes=axes, keepdims=keepdims)
    nodes[0] = mean
    return _model(nodes, x, inits, opset), x


@pytest.mark.parametrize(("opset", "axes"), [(17, [2, 3]), (18, [-1, -2]), (18, [3, -2])])
def test_a_reduce_mean_over_the_plane_is_a_squeeze_excite_too(opset: int, axes: list[int]) -> None:
    m, x = _se_with_mean(opset, axes, 1)
    model = tfrt_py.load(m, executor="sync")
    assert [n.op_type for n in model.prepared.graph.nodes] == ["SqueezeExcite"]
    np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axes", [[3], [-2], [2, 2]])
def test_other_means_stay_apart(axes: list[int]) -> None:
    """A mean over one axis of the plane is not the block's pool (its gate broadcasts over
    the other): the nodes run unfused, as onnxruntime computes them. (Repeated axes are
    not the plane either.)"""
    m, x = _se_with_mean(18 if axes != [2, 2] else 17, axes, 1)
    model = tfrt_py.load(m, executor="sync")
    assert "SqueezeExcite" not in [n.op_type for n in model.prepared.graph.nodes]
    if axes != [2, 2]:  # onnxruntime refuses repeated axes
        np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-5, atol=1e-6)


def test_a_squeeze_excite_whose_gate_is_read_elsewhere_stays_apart() -> None:
    """An intermediate value with another reader (here the gate is a graph output too)
    keeps the nodes: the fused kernel would not produce it."""
    x = _RNG.standard_normal((1, 16, 5, 5)).astype(np.float32)
    inits = {"w1": _RNG.standard_normal((4, 16, 1, 1)).astype(np.float32),
             "b1": np.zeros(4, np.float32),
             "w2": _RNG.standard_normal((16, 4, 1, 1)).astype(np.float32),
             "b2": np.zeros(16, np.float32)}  # fmt: skip
    m = _model(_se_nodes("Relu", "Sigmoid", True), x, inits)
    m.graph.output.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))
    model = tfrt_py.load(m, executor="sync")
    assert "SqueezeExcite" not in [n.op_type for n in model.prepared.graph.nodes]
    got = model.run({"x": x})
    so = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want_y, want_s = so.run(["y", "s"], {"x": x})
    np.testing.assert_allclose(got["y"], want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["s"], want_s, rtol=1e-5, atol=1e-6)


# -- BatchNormalization + activation (DenseNet's pre-activation) ------------------------------


def _bn_nodes(act: str, conv_first: bool) -> list[Any]:
    """[Conv ->] Concat(x, x) -> BatchNormalization -> act -> y (no conv can take the BN)."""
    mk = helper.make_node
    src = "x"
    nodes = []
    if conv_first:
        nodes.append(mk("Conv", ["x", "w"], ["cx"], pads=[1, 1, 1, 1]))
        src = "cx"
    nodes += [
        mk("Concat", [src, "x"], ["cat"], axis=1),
        mk("BatchNormalization", ["cat", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
    ]
    if act == "none":
        nodes[-1].output[0] = "y"
    elif act == "Clip":
        nodes.append(mk("Clip", ["n", "lo", "hi"], ["y"]))
    else:
        nodes.append(mk(act, ["n"], ["y"]))
    return nodes  # fmt: skip


@pytest.mark.parametrize("act", ["Relu", "Clip", "HardSwish", "none"])
@pytest.mark.parametrize("shape", [(1, 8, 14, 14), (2, 4, 5, 7), (1, 6, 33)], ids=str)
def test_batch_norm_and_its_activation_are_one_pass(jit: str, act: str, shape: Any) -> None:
    """The BatchNormalization no conv took, and its activation, run as one BatchNormAct
    node: onnxruntime's values, and (ReLU, Clip, none) the unfused nodes' bits; ``out=``
    and in place."""
    x = _RNG.standard_normal(shape).astype(np.float32)
    c = 2 * shape[1]
    inits = {"s": _RNG.standard_normal(c).astype(np.float32),
             "b": _RNG.standard_normal(c).astype(np.float32),
             "m": _RNG.standard_normal(c).astype(np.float32),
             "v": _RNG.uniform(0.1, 2.0, c).astype(np.float32),
             "lo": np.float32(-0.3), "hi": np.float32(0.7)}  # fmt: skip
    m = _model(_bn_nodes(act, False), x, inits)
    model = tfrt_py.load(m, executor="sync")
    assert "1 BatchNormalization+activation" in _summary(model)
    ops = [n.op_type for n in model.prepared.graph.nodes]
    assert ops == ["Concat", "BatchNormAct"], ops
    want = _ort(m, x)
    got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if act != "HardSwish":
        off = tfrt_py.load(m, optimize=set(PASSES) - {"fuse_vision"}, executor="sync")
        np.testing.assert_array_equal(got, off.run({"x": x})["y"])
    out = np.full(want.shape, np.nan, np.float32)
    assert model.run({"x": x}, outputs={"y": out})["y"] is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_large_batch_norm_splits_by_channels_on_two_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A BatchNormAct over at least ``SPLIT_MIN_ELEMENTS`` on a two-thread model runs in
    blocks of channels on the native threads: the same bits as on one thread."""
    from tfrt_py.concurrency import native_threads

    real = norm_affine.AFFINE_ACT_PAR
    if real.get() is None or not native_threads.ready():
        pytest.skip("no compiled parallel kernel here (numba or its threads off)")
    parts: list[int] = []

    def get() -> Any:
        fn = real.get()

        def spy(*args: Any) -> None:
            parts.append(args[-1].shape[0] - 1)
            fn(*args)

        return spy

    monkeypatch.setattr(norm_affine, "AFFINE_ACT_PAR", SimpleNamespace(get=get))
    shape = (2, 24, 40, 40)  # 2 x 48 channels after the Concat: 153,600 elements
    x = _RNG.standard_normal(shape).astype(np.float32)
    c = 2 * shape[1]
    inits = {"s": _RNG.standard_normal(c).astype(np.float32),
             "b": _RNG.standard_normal(c).astype(np.float32),
             "m": _RNG.standard_normal(c).astype(np.float32),
             "v": _RNG.uniform(0.1, 2.0, c).astype(np.float32)}  # fmt: skip
    m = _model(_bn_nodes("Relu", False), x, inits)
    two = tfrt_py.load(m, executor="sync", threads=2).run({"x": x})["y"]
    assert parts and parts[-1] >= 2
    one = tfrt_py.load(m, executor="sync", threads=1).run({"x": x})["y"]
    np.testing.assert_array_equal(two, one)
    np.testing.assert_allclose(two, _ort(m, x), rtol=1e-5, atol=1e-5)


def test_a_batch_norm_after_a_conv_stays_in_the_conv() -> None:
    """fuse_conv folds a BatchNormalization reading a conv into its weights first; one
    reading a Concat (or anything else) is this pass's."""
    x = _RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    inits = {"w": _RNG.standard_normal((4, 4, 3, 3)).astype(np.float32),
             "s": np.ones(8, np.float32), "b": np.zeros(8, np.float32),
             "m": np.zeros(8, np.float32), "v": np.ones(8, np.float32)}  # fmt: skip
    conv_bn = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
               helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
               helper.make_node("Relu", ["n"], ["y"])]  # fmt: skip
    inits4 = {k: (v[:4] if v.ndim == 1 else v) for k, v in inits.items()}
    model = tfrt_py.load(_model(conv_bn, x, inits4), executor="sync")
    assert [n.op_type for n in model.prepared.graph.nodes] == ["Conv"]
    m = _model(_bn_nodes("Relu", True), x, inits)
    model = tfrt_py.load(m, executor="sync")
    assert [n.op_type for n in model.prepared.graph.nodes] == ["Conv", "Concat", "BatchNormAct"]
    np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-5, atol=1e-5)


def test_a_rank_two_or_float64_batch_norm_stays_apart() -> None:
    """Rank 2 (a BatchNorm1d over features) and float64 keep the BatchNormalization kernel."""
    for shape, dt in (((3, 6), np.float32), ((1, 6, 4, 4), np.float64)):
        x = _RNG.standard_normal(shape).astype(dt)
        inits = {k: np.ones(6, dt) for k in ("s", "v")} | {k: np.zeros(6, dt) for k in "bm"}
        nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"]),
                 helper.make_node("Relu", ["n"], ["y"])]  # fmt: skip
        model = tfrt_py.load(_model(nodes, x, inits), executor="sync")
        assert "BatchNormAct" not in [n.op_type for n in model.prepared.graph.nodes]


def _linear_norm(rank3: bool, extra_reader: bool) -> tuple[onnx.ModelProto, np.ndarray]:
    """timm's LinearNorm as torch.onnx writes it: MatMul -> Flatten -> BatchNormalization ->
    Reshape (rank 3), or MatMul -> BatchNormalization (rank 2)."""
    mk = helper.make_node
    x = _RNG.standard_normal((2, 5, 8) if rank3 else (7, 8)).astype(np.float32)
    inits = {"w": _RNG.standard_normal((8, 6)).astype(np.float32),
             "s": _RNG.standard_normal(6).astype(np.float32),
             "b": _RNG.standard_normal(6).astype(np.float32),
             "m": _RNG.standard_normal(6).astype(np.float32),
             "v": _RNG.uniform(0.1, 2.0, 6).astype(np.float32)}  # fmt: skip
    nodes = [mk("MatMul", ["x", "w"], ["p"])]
    if rank3:
        # reshape_as: the product's shape read back (a Shape reader the fold leaves alone)
        nodes += [mk("Flatten", ["p"], ["f"], axis=2), mk("Shape", ["p"], ["ps"]),
                  mk("BatchNormalization", ["f", "s", "b", "m", "v"], ["n"]),
                  mk("Reshape", ["n", "ps"], ["r"]), mk("HardSwish", ["r"], ["y"])]  # fmt: skip
    else:
        nodes += [mk("BatchNormalization", ["p", "s", "b", "m", "v"], ["y"])]
    if extra_reader:
        nodes[-1].output[0] = "y0"
        nodes.append(mk("Add", ["y0", "p" if not rank3 else "r"], ["y"]))
    return _model(nodes, x, inits), x


@pytest.mark.parametrize("rank3", [True, False])
def test_a_products_batch_norm_is_folded_into_its_weights(rank3: bool) -> None:
    """The BatchNorm1d after a constant-weight MatMul (through a Flatten to (rows,
    features)) leaves no pass: the product's weights scaled, its shift the Linear's bias;
    onnxruntime's values."""
    m, x = _linear_norm(rank3, False)
    model = tfrt_py.load(m, executor="sync")
    assert "1 BatchNormalization folded into a product" in _summary(model)
    ops = [n.op_type for n in model.prepared.graph.nodes]
    assert "BatchNormalization" not in ops and "Linear" in ops, ops
    np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-5, atol=1e-5)


def test_a_product_read_elsewhere_keeps_its_batch_norm() -> None:
    """A product whose output another node reads too is not changed."""
    m, x = _linear_norm(False, True)
    model = tfrt_py.load(m, executor="sync")
    assert "BatchNormalization" in [n.op_type for n in model.prepared.graph.nodes]
    np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-5, atol=1e-5)


def test_an_infinite_scale_is_not_folded_into_a_product() -> None:
    """A BatchNorm1d whose scale is infinite (variance 0, epsilon 0) stays a node: folded
    into the weights, each column's sum would mix +inf and -inf into NaN where
    onnxruntime gives the infinities."""
    m, x = _linear_norm(False, False)
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    bn.attribute.append(helper.make_attribute("epsilon", 0.0))
    var = next(i for i in m.graph.initializer if i.name == "v")
    v = numpy_helper.to_array(var).copy()
    v[0] = 0.0
    var.CopyFrom(numpy_helper.from_array(v, "v"))
    with np.errstate(divide="ignore", invalid="ignore"):  # the kernel's own 1 / sqrt(0)
        model = tfrt_py.load(m, executor="sync")
        got = model.run({"x": x})["y"]
    assert "BatchNormalization" in [n.op_type for n in model.prepared.graph.nodes]
    want = _ort(m, x)
    assert not np.isfinite(want[:, 0]).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # inf and NaN where it has them
