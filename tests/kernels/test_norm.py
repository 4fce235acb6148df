"""Norm-family kernels against onnxruntime on one-node models (constant and runtime
parameters), plus dtype, ``out=`` and opset-difference checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support.kernel_harness import Harness
from tfrt_py.kernels.nn import norm, norm_group

KERNEL_FAMILIES = (norm, norm_group)
_RNG = np.random.default_rng(1)


def _f(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("opset", [7, 9, 15])
def test_batch_norm_inference(harness: Harness, dtype: Any, opset: int) -> None:
    c = 3
    params = [_f(c, dtype=dtype), _f(c, dtype=dtype), _f(c, dtype=dtype)]
    var = (np.abs(_f(c)) + 0.1).astype(dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-4
    for x in (_f(2, c, 4, 5, dtype=dtype), _f(2, c, dtype=dtype)):
        harness.check(
            "BatchNormalization", [x, *params, var], {"epsilon": 1e-3}, opset=opset, tol=tol
        )


def test_batch_norm_folded_out_and_training(harness: Harness) -> None:
    x = _f(2, 3, 4, 5)
    p = [_f(3), _f(3), _f(3), np.abs(_f(3)) + 0.1]
    fn = harness.build("BatchNormalization", [x, *p], {}, opset=15, const=(1, 2, 3, 4))
    want = harness.ort("BatchNormalization", [x, *p], {}, opset=15)[0]
    out = np.empty_like(x)
    assert fn(x, *p, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    xin = x.copy()
    fn(xin, *p, out=xin)  # registered inplace
    np.testing.assert_allclose(xin, want, rtol=1e-5, atol=1e-5)
    attrs = {"training_mode": 1, "momentum": 0.7}
    harness.check("BatchNormalization", [x, *p], attrs, opset=15, n_out=3)


def test_layer_norm_outputs_axis_and_out(harness: Harness) -> None:
    x = _f(2, 3, 4)
    for axis in (-1, 1):
        shp = x.shape[axis:]
        harness.check(
            "LayerNormalization", [x, _f(*shp), _f(*shp)], {"axis": axis}, opset=17, n_out=3
        )
    harness.check("LayerNormalization", [x, _f(4)], {"epsilon": 1e-2}, opset=17)
    h = _f(2, 5, dtype=np.float16)
    harness.check("LayerNormalization", [h, _f(5, dtype=np.float16)], {}, opset=17, tol=1e-2)
    s, b = _f(4), _f(4)
    fn = harness.build("LayerNormalization", [x, s, b], {}, opset=17)
    out = np.empty_like(x)
    assert fn(x, s, b, out=out) is out
    np.testing.assert_allclose(out, fn(x, s, b), rtol=1e-6)


def test_group_norm_scale_per_group_vs_per_channel(harness: Harness) -> None:
    x = _f(2, 6, 3, 3)
    harness.check("GroupNormalization", [x, _f(6), _f(6)], {"num_groups": 3}, opset=21)
    s, b = _f(3), _f(3)  # opset 18: per group, broadcast to the group's channels
    y18 = harness.build("GroupNormalization", [x, s, b], {"num_groups": 3}, opset=18)(x, s, b)
    y21 = harness.build("GroupNormalization", [x, s, b], {"num_groups": 3}, opset=21)
    np.testing.assert_allclose(y18, y21(x, np.repeat(s, 2), np.repeat(b, 2)), rtol=1e-6)


def test_instance_lrn_mvn_lp_rms(harness: Harness) -> None:
    x = _f(2, 5, 4, 3)
    harness.check("InstanceNormalization", [x, _f(5), _f(5)], {"epsilon": 1e-3}, opset=6)
    harness.check("InstanceNormalization", [_f(2, 5, 7), _f(5), _f(5)], {}, opset=6)
    for size in (1, 3, 5):
        harness.check("LRN", [x], {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 2.0}, opset=13)
    harness.check("MeanVarianceNormalization", [x], {}, opset=13)
    harness.check("MeanVarianceNormalization", [x], {"axes": [1, 3]}, opset=13)
    for p in (1, 2):
        harness.check("LpNormalization", [x], {"p": p, "axis": 1}, opset=1)
    z = np.zeros((2, 3), np.float32)
    assert np.array_equal(harness.build("LpNormalization", [z], {}, opset=22)(z), z)  # 0/0 -> 0
    s = _f(3)
    xr = _f(2, 4, 3)
    want = xr / np.sqrt(np.mean(xr.astype(np.float64) ** 2, -1, keepdims=True) + 1e-5) * s
    got = harness.build("RMSNormalization", [xr, s], {}, opset=23)(xr, s)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
