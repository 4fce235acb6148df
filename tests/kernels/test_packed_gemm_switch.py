"""``TFRT_PY_PACKED_GEMM=0`` switches the packed-weight product off (CI's fallback leg runs
the suite so): the kernel reports itself unavailable, ``features()`` says why, and a
model whose products would use it computes the same values with NumPy's gemm."""

from __future__ import annotations

import numpy as np
import pytest

import tfrt_py
from tfrt_py.ir import GraphBuilder
from tfrt_py.kernels.lib import gemm_packed
from tfrt_py.kernels.lib.features import features


def _mlp() -> tfrt_py.Model:
    """x[N, 32] @ W[32, 64] + b, ReLU: a product the packed kernel takes (N % 16 == 0)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("mlp", opset=17)
    x = b.input("x", np.float32, ("N", 32))
    w = b.const(rng.standard_normal((32, 64)).astype(np.float32))
    bias = b.const(rng.standard_normal(64).astype(np.float32))
    b.output(b.op("Relu", b.op("Add", b.op("MatMul", x, w), bias)), "y")
    return tfrt_py.load(b.build(), executor="sync")


def test_the_switch_turns_the_packed_gemm_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gemm_packed.ENV_PACKED_GEMM, "0")
    assert not gemm_packed.available()
    assert gemm_packed.kernel() is None
    row = next(f for f in features() if f.name == "packed gemm")
    assert row.on is False and gemm_packed.ENV_PACKED_GEMM in row.why


def test_a_model_computes_the_same_with_the_switch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(6).standard_normal((48, 32)).astype(np.float32)
    on = _mlp().run({"x": x})["y"]
    monkeypatch.setenv(gemm_packed.ENV_PACKED_GEMM, "0")
    off = _mlp().run({"x": x})["y"]
    np.testing.assert_allclose(off, on, rtol=1e-5, atol=1e-5)
