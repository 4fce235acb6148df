"""Attention with an additive mask as one op: torch's exported ``scaled_dot_product_attention``
(optimum's GPT-2 and Llama) writes ``MatMul(Where(IsNaN(w), 0, w), V)`` with ``w =
Softmax(MatMul(Q s, Transpose(K s)) + Where(mask, 0, -inf))``; ``fuse_transformer`` makes it
one ``tfrt_py.fused::SoftmaxAttention(Q, K, V, sa, sb, s, bias)`` with ``nan_to_zero=1``.
Checked against onnxruntime on graphs built here: a decode step (one query row, the
blocked path), a causal prompt (the unfused steps), rows the mask hides entirely (zeros,
not NaN), and a bias that broadcasts the scores to a larger batch (the unfused answer)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py

_RNG = np.random.default_rng(11)


def _sdpa_graph(heads: int, d: int, *, cleanup: bool = True) -> onnx.ModelProto:
    """q (B, H, Lq, d), k and v (B, H, Lk, d), mask bool (Bm, 1, Lq, Lk) -> y, as torch
    exports scaled_dot_product_attention with a boolean mask."""
    f = TensorProto.FLOAT
    inits = [
        numpy_helper.from_array(np.array([d**-0.25], np.float32), "root"),
        numpy_helper.from_array(np.array([0.0], np.float32), "zero"),
        numpy_helper.from_array(np.array([-np.inf], np.float32), "minus_inf"),
    ]
    nodes = [
        helper.make_node("Mul", ["q", "root"], ["qs"]),
        helper.make_node("Mul", ["k", "root"], ["ks"]),
        helper.make_node("Transpose", ["ks"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
        helper.make_node("Where", ["mask", "zero", "minus_inf"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["w"], axis=-1),
    ]
    if cleanup:
        nodes += [
            helper.make_node("IsNaN", ["w"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "w"], ["w0"]),
            helper.make_node("MatMul", ["w0", "v"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("MatMul", ["w", "v"], ["y"]))
    dims: list[str | int | None] = ["b", heads, "lq", d]
    kv: list[str | int | None] = ["b", heads, "lk", d]
    g = helper.make_graph(
        nodes, "sdpa",
        [helper.make_tensor_value_info("q", f, dims), helper.make_tensor_value_info("k", f, kv),
         helper.make_tensor_value_info("v", f, kv),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["bm", 1, "lq", "lk"])],
        [helper.make_tensor_value_info("y", f, None)], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(b: int, heads: int, lq: int, lk: int, d: int, mask: np.ndarray) -> dict[str, Any]:
    r = _RNG.standard_normal
    return {
        "q": r((b, heads, lq, d)).astype(np.float32),
        "k": r((b, heads, lk, d)).astype(np.float32),
        "v": r((b, heads, lk, d)).astype(np.float32),
        "mask": mask,
    }


def _fused(model: tfrt_py.Model) -> int:
    report = next(r.summary for r in model.prepared.reports if r.name == "fuse_transformer")
    return int(report.split(" SoftmaxAttention")[0].rsplit(" ", 1)[-1])


def _check(m: onnx.ModelProto, feeds: dict[str, Any]) -> None:
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    for ex in ("sync", "async"):
        model = tfrt_py.load(m, executor=ex)
        assert _fused(model) == 1
        node = next(n for n in model.prepared.graph.nodes if n.op_type == "SoftmaxAttention")
        assert node.attrs.get("nan_to_zero") == 1
        assert len(node.inputs) == 7  # q, k, v, sa, sb, (no post scale), bias
        got = model.run(feeds)["y"]
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_decode_step_over_a_long_past_is_one_op() -> None:
    lk = 513  # 2 x 4 heads x 1 x 513 x 128 multiply-adds: the blocked path
    mask = np.ones((2, 1, 1, lk), bool)
    mask[0, ..., 7:20] = False
    mask[1] = False  # the second sequence sees no key: zeros
    feeds = _feeds(2, 4, 1, lk, 64, mask)
    _check(_sdpa_graph(4, 64), feeds)
    assert (tfrt_py.load(_sdpa_graph(4, 64)).run(feeds)["y"][1] == 0).all()


def test_a_causal_prompt_with_rows_the_mask_hides_entirely() -> None:
    lq = 9
    mask = np.tril(np.ones((lq, lq), bool))[None, None].repeat(2, axis=0)
    mask[1, 0, 3, :] = False  # a row that sees no key: NaN weights, then zeros
    mask[0, 0, 0, :] = False
    feeds = _feeds(2, 3, lq, lq, 16, mask)
    _check(_sdpa_graph(3, 16), feeds)
    y = tfrt_py.load(_sdpa_graph(3, 16)).run(feeds)["y"]
    assert (y[1, :, 3] == 0).all() and (y[0, :, 0] == 0).all()


@pytest.mark.parametrize("lk", [5, 300])  # the unfused steps, and the blocked path
def test_a_bias_that_grows_the_scores_gives_the_unfused_answer(lk: int) -> None:
    mask = _RNG.random((2, 1, 3, lk)) > 0.3  # batch 2 against the scores' batch of 1
    _check(_sdpa_graph(2, 8), _feeds(1, 2, 3, lk, 8, mask))


def test_without_the_nan_cleanup_masked_rows_stay_nan() -> None:
    m = _sdpa_graph(2, 8, cleanup=False)
    mask = np.ones((1, 1, 4, 6), bool)
    mask[0, 0, 2, :] = False
    feeds = _feeds(1, 2, 4, 6, 8, mask)
    model = tfrt_py.load(m)
    assert _fused(model) == 1
    node = next(n for n in model.prepared.graph.nodes if n.op_type == "SoftmaxAttention")
    assert "nan_to_zero" not in node.attrs
    got = model.run(feeds)["y"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    assert np.isnan(got[0, :, 2]).all() and np.isnan(want[0, :, 2]).all()
    np.testing.assert_allclose(got[0, :, [0, 1, 3]], want[0, :, [0, 1, 3]], rtol=2e-5, atol=2e-6)
