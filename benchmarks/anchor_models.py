"""The anchor latency models M1-M4 (``../shared/anchors.md``), built from fixed seeds, each
with hand-written NumPy baselines: "fresh" (allocating) and "prealloc" (``out=`` buffers,
the zero-overhead limit a Python runtime can approach).

Each ``build_*`` returns an ``Anchor``: the ONNX model, feeds, and the two NumPy runners
(which return the model's outputs, so they are checked against every runtime). ``kind`` and
``params`` give the same fixed-seed weights to hand-written peers (``benchmarks/peers.py``):
"matmul_chain" {ws}; "mlp" {ws, bs, relu_last, softmax}; "ads" {maxes, w0, b0, w1, b1}.
Weights are stored as [in, out] (``x @ w``), as in the ONNX model.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["ANCHORS", "Anchor"]

F32 = np.float32


@dataclass
class Anchor:
    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    numpy_fresh: Callable[[], list[np.ndarray]]
    numpy_prealloc: Callable[[], list[np.ndarray]]
    kind: str = ""
    params: dict[str, Any] = field(default_factory=dict)


def _model(nodes: list, name: str, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _vi(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def m1_matmul_chain(seed: int = 1) -> Anchor:
    """x[1,16]; 64 x (MatMul with constant W_i[16,16], then Relu)."""
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((16, 16)) / 4).astype(F32) for _ in range(64)]
    nodes, inits, cur = [], [], "x"
    for i, w in enumerate(ws):
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        nodes.append(helper.make_node("MatMul", [cur, f"W{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"]))
        cur = f"r{i}"
    model = _model(nodes, "m1", [_vi("x", [1, 16])], [_vi(cur, [1, 16])], inits)
    x = rng.standard_normal((1, 16)).astype(F32)

    def fresh() -> list[np.ndarray]:
        h = x
        for w in ws:
            h = np.maximum(h @ w, 0)
        return [h]

    a, b = np.empty((1, 16), F32), np.empty((1, 16), F32)
    zero = F32(0)

    def prealloc() -> list[np.ndarray]:
        src, dst = x, a
        for w in ws:
            np.matmul(src, w, out=dst)
            np.maximum(dst, zero, out=dst)
            src, dst = dst, (b if dst is a else a)
        return [src]

    return Anchor("M1 matmul-chain", model, {"x": x}, fresh, prealloc, "matmul_chain", {"ws": ws})


def _mlp(name: str, sizes: list[int], batch: int, seed: int) -> Anchor:
    rng = np.random.default_rng(seed)
    ws = [
        (rng.standard_normal((i, o)) / np.sqrt(i)).astype(F32) for i, o in itertools.pairwise(sizes)
    ]
    bs = [(rng.standard_normal(o) * 0.1).astype(F32) for o in sizes[1:]]
    nodes, inits, cur = [], [], "x"
    for i, (w, b) in enumerate(zip(ws, bs)):
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"B{i}"], [f"g{i}"]))
        cur = f"g{i}"
        if i < len(ws) - 1 or name.startswith("M4"):
            nodes.append(helper.make_node("Relu", [cur], [f"r{i}"]))
            cur = f"r{i}"
    softmax = not name.startswith("M4")
    if softmax:
        nodes.append(helper.make_node("Softmax", [cur], ["probs"], axis=-1))
        cur = "probs"
    model = _model(
        nodes,
        name.split()[0].lower(),
        [_vi("x", [batch, sizes[0]])],
        [_vi(cur, [batch, sizes[-1]])],
        inits,
    )
    x = rng.standard_normal((batch, sizes[0])).astype(F32)
    relu_last = not softmax

    def fresh() -> list[np.ndarray]:
        h = x
        for i, (w, b) in enumerate(zip(ws, bs)):
            h = h @ w + b
            if i < len(ws) - 1 or relu_last:
                h = np.maximum(h, 0)
        if softmax:
            e = np.exp(h - h.max(axis=-1, keepdims=True))
            h = e / e.sum(axis=-1, keepdims=True)
        return [h]

    bufs = [np.empty((batch, o), F32) for o in sizes[1:]]
    red = np.empty((batch, 1), F32)
    zero = F32(0)

    def prealloc() -> list[np.ndarray]:
        h = x
        for i, (w, b, buf) in enumerate(zip(ws, bs, bufs)):
            np.matmul(h, w, out=buf)
            np.add(buf, b, out=buf)
            if i < len(ws) - 1 or relu_last:
                np.maximum(buf, zero, out=buf)
            h = buf
        if softmax:
            np.max(h, axis=-1, keepdims=True, out=red)
            np.subtract(h, red, out=h)
            np.exp(h, out=h)
            np.sum(h, axis=-1, keepdims=True, out=red)
            np.divide(h, red, out=h)
        return [h]

    params = {"ws": ws, "bs": bs, "relu_last": relu_last, "softmax": softmax}
    return Anchor(name, model, {"x": x}, fresh, prealloc, "mlp", params)


def m2_mlp_small(seed: int = 2) -> Anchor:
    return _mlp("M2 mlp-small", [64, 256, 256, 10], 1, seed)


def m2b_mlp_small_batch64(seed: int = 2) -> Anchor:
    return _mlp("M2b mlp-small b64", [64, 256, 256, 10], 64, seed)


def m4_mlp_wide(seed: int = 4) -> Anchor:
    return _mlp("M4 mlp-wide", [1024, 1024, 1024, 1024], 1, seed)


def m3_ads_normalize(seed: int = 3) -> Anchor:
    """18 inputs [1,1], each / its own max; Concat; Gemm 18x64 + Relu; Gemm 64x1; Sigmoid."""
    rng = np.random.default_rng(seed)
    maxes = [np.array([[rng.uniform(10, 1000)]], F32) for _ in range(18)]
    w0 = (rng.standard_normal((18, 64)) / 4).astype(F32)
    b0 = (rng.standard_normal(64) * 0.1).astype(F32)
    w1 = (rng.standard_normal((64, 1)) / 8).astype(F32)
    b1 = (rng.standard_normal(1) * 0.1).astype(F32)
    nodes, inits, ins = [], [], []
    for i, m in enumerate(maxes):
        ins.append(_vi(f"f{i}", [1, 1]))
        inits.append(numpy_helper.from_array(m, f"max{i}"))
        nodes.append(helper.make_node("Div", [f"f{i}", f"max{i}"], [f"n{i}"]))
    nodes.append(helper.make_node("Concat", [f"n{i}" for i in range(18)], ["feat"], axis=1))
    for name, arr in (("W0", w0), ("B0", b0), ("W1", w1), ("B1", b1)):
        inits.append(numpy_helper.from_array(arr, name))
    nodes += [
        helper.make_node("Gemm", ["feat", "W0", "B0"], ["g0"]),
        helper.make_node("Relu", ["g0"], ["r0"]),
        helper.make_node("Gemm", ["r0", "W1", "B1"], ["g1"]),
        helper.make_node("Sigmoid", ["g1"], ["score"]),
    ]
    model = _model(nodes, "m3", ins, [_vi("score", [1, 1])], inits)
    feeds = {f"f{i}": np.array([[rng.uniform(0, 1000)]], F32) for i in range(18)}
    fs = [feeds[f"f{i}"] for i in range(18)]

    def fresh() -> list[np.ndarray]:
        feat = np.concatenate([f / m for f, m in zip(fs, maxes)], axis=1)
        h = np.maximum(feat @ w0 + b0, 0)
        return [1 / (1 + np.exp(-(h @ w1 + b1)))]

    feat = np.empty((1, 18), F32)
    cols = [feat[:, i : i + 1] for i in range(18)]
    h0 = np.empty((1, 64), F32)
    h1 = np.empty((1, 1), F32)
    zero, one = F32(0), F32(1)

    def prealloc() -> list[np.ndarray]:
        for f, m, c in zip(fs, maxes, cols):
            np.divide(f, m, out=c)
        np.matmul(feat, w0, out=h0)
        np.add(h0, b0, out=h0)
        np.maximum(h0, zero, out=h0)
        np.matmul(h0, w1, out=h1)
        np.add(h1, b1, out=h1)
        np.negative(h1, out=h1)
        np.exp(h1, out=h1)
        np.add(h1, one, out=h1)
        np.divide(one, h1, out=h1)
        return [h1]

    params = {"maxes": maxes, "w0": w0, "b0": b0, "w1": w1, "b1": b1}
    return Anchor("M3 ads-normalize", model, feeds, fresh, prealloc, "ads", params)


ANCHORS: dict[str, Callable[[], Anchor]] = {
    "M1": m1_matmul_chain,
    "M2": m2_mlp_small,
    "M2b": m2b_mlp_small_batch64,
    "M3": m3_ads_normalize,
    "M4": m4_mlp_wide,
}
