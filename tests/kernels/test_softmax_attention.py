"""Attention without a mask as one op: ``fuse_transformer`` turns ``MatMul(Softmax(
MatMulTransB(Q, K)), V)`` into ``tfrt_py.fused::SoftmaxAttention`` and ``kernels/lib/sdpa.py``
runs it in blocks of query rows. Checked against onnxruntime on graphs built here: 3-D and
4-D operands, query and key lengths that leave partial blocks, a value width other than
the key's, Q/K scalings, heads split out of one projection (strided views), ``outputs=``
buffers, the unfused fallback (float64, small, no native threads), NaN rows, and the
patterns the pass must leave alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.kernels.lib import sdpa

_RNG = np.random.default_rng(5)


def _r(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(dtype)


def _graph(
    q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], *, scale: float | None = None,
    axis: int = -1, elem: int = TensorProto.FLOAT, scores_out: bool = False,
) -> onnx.ModelProto:  # fmt: skip
    """Q, K, V inputs -> [Mul(Q, s), Mul(K, s)] -> MatMul(Q, Transpose(K)) -> Softmax ->
    MatMul(., V)."""
    perm = [*range(len(k) - 2), len(k) - 1, len(k) - 2]
    nodes, inits, qn, kn = [], [], "q", "k"
    if scale is not None:
        dt = np.float32 if elem == TensorProto.FLOAT else np.float64
        inits.append(numpy_helper.from_array(np.array(scale, dt), "s"))
        nodes += [helper.make_node("Mul", ["q", "s"], ["qs"]),
                  helper.make_node("Mul", ["k", "s"], ["ks"])]  # fmt: skip
        qn, kn = "qs", "ks"
    nodes += [
        helper.make_node("Transpose", [kn], ["kt"], perm=perm),
        helper.make_node("MatMul", [qn, "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=axis),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    outs = [helper.make_tensor_value_info("y", elem, None)]
    if scores_out:
        outs.append(helper.make_tensor_value_info("scores", elem, None))
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, elem, s) for n, s in (("q", q), ("k", k), ("v", v))],
        outs, inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _fused(model: tfrt_py.Model) -> int:
    report = next(r.summary for r in model.prepared.reports if r.name == "fuse_transformer")
    return int(report.split(" SoftmaxAttention")[0].rsplit(" ", 1)[-1])


@pytest.mark.parametrize(
    ("q", "k", "v", "scale"),
    [
        ((4, 4, 256, 16), (4, 4, 256, 16), (4, 4, 256, 16), 0.5),  # MobileViT's
        ((1, 3, 197, 64), (1, 3, 197, 64), (1, 3, 197, 64), 0.35),  # ViT-Tiny's
        ((2, 130, 24), (2, 300, 24), (2, 300, 40), None),  # partial blocks, dv != d
        ((2, 3, 61, 8), (2, 3, 1030, 8), (2, 3, 1030, 5), 0.7),  # a block of a few rows
    ],
)
def test_attention_is_one_op_and_matches_onnxruntime(
    q: Any, k: Any, v: Any, scale: float | None
) -> None:
    feeds = {"q": _r(*q), "k": _r(*k), "v": _r(*v)}
    m = _graph(q, k, v, scale=scale)
    model = tfrt_py.load(m, executor="sync")
    assert _fused(model) == 1
    want = _ort(m, feeds)[0]
    np.testing.assert_allclose(model.run(feeds)["y"], want, rtol=1e-4, atol=1e-5)
    out = np.full(want.shape, np.nan, np.float32)
    assert model.run(feeds, outputs={"y": out})["y"] is out
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_heads_split_out_of_one_projection() -> None:
    """Q, K and V as head views of one (1, L, 3 x H x D) projection (ViT's export): strided
    operands the blocks read in place."""
    L, H, D = 50, 3, 16
    x = _r(1, L, 3 * H * D)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]),
        helper.make_node("Split", ["t"], ["q5", "k5", "v5"], axis=0, num_outputs=3),
        helper.make_node("Squeeze", ["q5", "zero"], ["q"]),
        helper.make_node("Squeeze", ["k5", "zero"], ["k"]),
        helper.make_node("Squeeze", ["v5", "zero"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1, L, 3, H, D], np.int64), "shape"),
             numpy_helper.from_array(np.array([0], np.int64), "zero")]  # fmt: skip
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model = tfrt_py.load(m, executor="sync")
    assert _fused(model) == 1
    np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, {"x": x})[0], rtol=1e-4,
                               atol=1e-5)  # fmt: skip


def test_nan_rows_and_small_inputs_match_the_unfused_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query row with a NaN gives a NaN output row, an all -inf key gives NaN rows (the
    Softmax kernel's semantics), fused or not; inputs under FUSED_MIN_MACS and runs
    without native threads take the unfused formulation inside the op."""
    q, k, v = _r(2, 2, 40, 16), _r(2, 2, 64, 16), _r(2, 2, 64, 16)
    q[0, 1, 3, 5] = np.nan
    k[1, 0, :, :] = -np.inf
    feeds = {"q": q, "k": k, "v": v}
    m = _graph(q.shape, k.shape, v.shape)
    fused = tfrt_py.load(m, executor="sync")
    plain = tfrt_py.load(m, executor="sync", optimize=False)
    assert _fused(fused) == 1
    with np.errstate(invalid="ignore"):  # NumPy's products warn on the NaN rows
        want = plain.run(feeds)["y"]
        assert np.isnan(want[0, 1, 3]).all() and np.isnan(want[1, 0]).all()
        np.testing.assert_allclose(fused.run(feeds)["y"], want, rtol=1e-4, atol=1e-5)
        monkeypatch.setenv("TFRT_PY_NATIVE_THREADS", "0")
        np.testing.assert_allclose(fused.run(feeds)["y"], want, rtol=1e-4, atol=1e-5)
        monkeypatch.delenv("TFRT_PY_NATIVE_THREADS")
    small = {"q": _r(1, 3, 4), "k": _r(1, 5, 4), "v": _r(1, 5, 2)}
    assert sdpa.FUSED_MIN_MACS > 3 * 5 * (4 + 2)
    ms = _graph((1, 3, 4), (1, 5, 4), (1, 5, 2), scale=0.5)
    np.testing.assert_allclose(tfrt_py.load(ms).run(small)["y"], _ort(ms, small)[0],
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_float64_attention_is_computed_unfused_inside_the_op() -> None:
    q, k, v = (_r(2, 33, 8, dtype=np.float64) for _ in range(3))
    m = _graph(q.shape, k.shape, v.shape, elem=TensorProto.DOUBLE)
    s = q @ np.swapaxes(k, -1, -2)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    got = tfrt_py.load(m, executor="sync").run({"q": q, "k": k, "v": v})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_scores_scaled_after_the_product_join_the_op() -> None:
    """``softmax((q @ k^T) * scale) @ v`` (the scale applied to the scores, as many exports
    write it) is one op too, the scale folded into the product's factor."""
    q, k, v = _r(2, 4, 70, 16), _r(2, 4, 90, 16), _r(2, 4, 90, 16)
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["scale", "qk"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
         for n, a in (("q", q), ("k", k), ("v", v))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0.25, np.float32), "scale")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"q": q, "k": k, "v": v}
    model = tfrt_py.load(m, executor="sync")
    assert _fused(model) == 1
    np.testing.assert_allclose(model.run(feeds)["y"], _ort(m, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["scores_output", "other_axis"])
def test_patterns_left_alone(case: str) -> None:
    """Scores that are also a graph output, and a Softmax over another axis, keep the
    three ops."""
    shape = (2, 3, 20, 8)
    feeds = {"q": _r(*shape), "k": _r(*shape), "v": _r(*shape)}
    if case == "scores_output":
        m = _graph(shape, shape, shape, scores_out=True)
    else:
        m = _graph(shape, shape, shape, axis=2)
    model = tfrt_py.load(m, executor="sync")
    assert _fused(model) == 0
    got, want = model.run(feeds), _ort(m, feeds)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-5)
