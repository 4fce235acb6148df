"""Tiny models exported by torch.onnx (``tests/vision_models/make.py``; no torch needed
here): the vision passes fire on the exporter's real patterns, and tfrt_py agrees with
onnxruntime at batch 1 and 3 (a dynamic batch axis), with the compiled kernels on and off,
on the sync and async executors, and with the vision passes off."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.support.paths import TESTS
from tfrt_py.compiler.pipeline import PASSES

_DIR = str(TESTS / "vision_models")

#: model file -> the fuse_conv / fuse_transformer report lines it must produce
_MODELS = {
    "tiny_mobilenet.onnx": (
        "7 Conv nodes (0 BatchNormalization and 0 channel scalings folded, 1 residual Adds, "
        "activations: Clip x2, HardSwish x1, SiLU x2, Sigmoid x1)",
        "nothing to fuse",
    ),
    "tiny_vit_op17.onnx": (
        "nothing to fuse",
        "1 GELU, 0 SiLU, 0 LayerNorm, 0 RMSNorm, 1 MatMulTransB, 1 SoftmaxAttention, 0 RotaryHalf "
        "(0 scalings moved before a Transpose)",
    ),
    "tiny_vit_op14.onnx": (
        "nothing to fuse",
        "1 GELU, 0 SiLU, 2 LayerNorm, 0 RMSNorm, 1 MatMulTransB, 1 SoftmaxAttention, 0 RotaryHalf "
        "(0 scalings moved before a Transpose)",
    ),
}


def _summary(model: tfrt_py.Model, name: str) -> str:
    return next(r.summary for r in model.prepared.reports if r.name == name)


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize("name", sorted(_MODELS))
def test_exported_model_matches_onnxruntime(jit: str, executor: str, name: str) -> None:
    path = os.path.join(_DIR, name)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    fused = tfrt_py.load(path, executor=executor)
    plain = tfrt_py.load(path, executor=executor,
                         optimize=set(PASSES) - {"fuse_conv", "fuse_transformer"})  # fmt: skip
    assert (_summary(fused, "fuse_conv"), _summary(fused, "fuse_transformer")) == _MODELS[name]
    rng = np.random.default_rng(3)
    for batch in (1, 3, 1):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        want = sess.run(None, {"input": x})[0]
        for model in (fused, plain):
            for _ in range(2):  # probe call, then the planned code
                got = model.run({"input": x})["output"]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
