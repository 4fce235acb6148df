"""The anchor latency models (benchmarks use them; the tests check them against
onnxruntime). All float32, default-domain opset 17, fixed seeds.

* M1: x[1,16] -> 64 x (MatMul with a constant W_i[16,16], Relu). Many tiny nodes: measures
  per-node dispatch overhead.
* M2: x[1,64] -> Gemm 64x256 + Relu -> Gemm 256x256 + Relu -> Gemm 256x10 -> Softmax.
  M2b is the same network at batch 64.
* M3: 18 inputs f0..f17 of shape [1,1], each divided by its own constant max, Concat on
  axis 1 -> [1,18] -> Gemm 18x64 + Relu -> Gemm 64x1 -> Sigmoid. Many small feeds.
* M4: x[1,1024] -> 3 x (Gemm 1024x1024 + Relu). Dominated by the matrix products.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from .builders import FLOAT, ModelCase, Net, float_feed, tensor_info

__all__ = [
    "ANCHORS",
    "m1",
    "m1_model",
    "m2",
    "m2_model",
    "m2b",
    "m3",
    "m3_model",
    "m4",
    "m4_model",
]


def m1_input() -> np.ndarray:
    return (np.abs(float_feed(np.random.default_rng(11), (1, 16))) + 0.1).astype(np.float32)


def m1_model() -> onnx.ModelProto:
    net = Net("anchor_m1", seed=1001)
    h = "x"
    act = m1_input().astype(np.float64)
    for i in range(64):
        # Random orthogonal weights, each rescaled so the sample input keeps its norm
        # through all 64 MatMul+Relu layers (a data-dependent init: no vanishing to zero).
        q, _ = np.linalg.qr(net.rng.standard_normal((16, 16)))
        nxt = np.maximum(act @ q, 0.0)
        q *= np.linalg.norm(act) / max(float(np.linalg.norm(nxt)), 1e-6)
        act = np.maximum(act @ q, 0.0)
        w = net.const(f"W{i}", q.astype(np.float32))
        h = net.op("MatMul", h, w, name=f"matmul_{i}")
        h = net.op("Relu", h, name=f"relu_{i}", outputs=["y"] if i == 63 else 1)
    return net.model([tensor_info("x", FLOAT, [1, 16])], [tensor_info("y", FLOAT, [1, 16])])


def m1() -> ModelCase:
    """M1: 64 x (MatMul 16x16 + Relu) on x[1,16]."""
    return ModelCase("anchor_m1", m1_model(), ({"x": m1_input()},))


def m2_model(batch: int = 1) -> onnx.ModelProto:
    net = Net(f"anchor_m2_b{batch}", seed=1002)
    h = net.dense("x", 64, 256)
    h = net.dense(h, 256, 256)
    logits = net.dense(h, 256, 10, act=None)
    net.op("Softmax", logits, axis=-1, outputs=["y"])
    return net.model([tensor_info("x", FLOAT, [batch, 64])], [tensor_info("y", FLOAT, [batch, 10])])


def m2() -> ModelCase:
    """M2: the 64-256-256-10 MLP with Softmax at batch 1."""
    x = float_feed(np.random.default_rng(12), (1, 64))
    return ModelCase("anchor_m2", m2_model(1), ({"x": x},))


def m2b() -> ModelCase:
    """M2b: M2 at batch 64 (same weights)."""
    x = float_feed(np.random.default_rng(13), (64, 64))
    return ModelCase("anchor_m2b", m2_model(64), ({"x": x},))


M3_FEATURES = 18


def m3_model() -> onnx.ModelProto:
    net = Net("anchor_m3", seed=1003)
    scaled = []
    for i in range(M3_FEATURES):
        max_i = net.const(f"max{i}", np.full((1, 1), 1.0 + i, np.float32))
        scaled.append(net.op("Div", f"f{i}", max_i, name=f"scale_{i}"))
    h = net.op("Concat", *scaled, axis=1)
    h = net.dense(h, M3_FEATURES, 64)
    h = net.dense(h, 64, 1, act=None)
    net.op("Sigmoid", h, outputs=["y"])
    return net.model(
        [tensor_info(f"f{i}", FLOAT, [1, 1]) for i in range(M3_FEATURES)],
        [tensor_info("y", FLOAT, [1, 1])],
    )


def m3() -> ModelCase:
    """M3: 18 scalar features, each scaled by its max, concatenated, MLP, Sigmoid."""
    rng = np.random.default_rng(14)
    feed = {
        f"f{i}": rng.uniform(0.0, 1.0 + i, size=(1, 1)).astype(np.float32)
        for i in range(M3_FEATURES)
    }
    return ModelCase("anchor_m3", m3_model(), (feed,))


def m4_model() -> onnx.ModelProto:
    net = Net("anchor_m4", seed=1004)
    h = "x"
    for i in range(3):
        h = net.dense(h, 1024, 1024, out="y" if i == 2 else None)
    return net.model([tensor_info("x", FLOAT, [1, 1024])], [tensor_info("y", FLOAT, [1, 1024])])


def m4() -> ModelCase:
    """M4: 3 x (Gemm 1024x1024 + Relu) on x[1,1024]."""
    x = float_feed(np.random.default_rng(15), (1, 1024))
    return ModelCase("anchor_m4", m4_model(), ({"x": x},))


#: Name -> builder, in benchmark order.
ANCHORS: dict[str, Callable[[], ModelCase]] = {
    "M1": m1,
    "M2": m2,
    "M2b": m2b,
    "M3": m3,
    "M4": m4,
}
