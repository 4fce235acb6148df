"""Pool-family kernels against onnxruntime on one-node models."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support.kernel_harness import Harness
from tfrt_py.kernels.nn import pool

KERNEL_FAMILIES = (pool,)
_RNG = np.random.default_rng(0)


def _r(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(dtype)


POOL_CASES = [
    # (op, x shape, attrs)
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (2, 3, 8, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [0, 1, 1, 0]}),
    (
        "MaxPool",
        (1, 2, 7, 8),
        {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
    ),
    ("MaxPool", (1, 3, 12), {"kernel_shape": [4], "strides": [3], "pads": [2, 2]}),
    ("MaxPool", (1, 4, 7, 7), {"kernel_shape": [7, 7]}),  # reduce path
    (
        "AveragePool",
        (1, 2, 9, 9),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    (
        "AveragePool",
        (1, 2, 9, 9),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    ),
    ("AveragePool", (1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", (1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER"}),
    ("AveragePool", (2, 8, 7, 7), {"kernel_shape": [7, 7]}),  # reduce path
    ("AveragePool", (1, 2, 5, 6, 7), {"kernel_shape": [2, 2, 3], "strides": [1, 2, 2]}),
    ("LpPool", (1, 2, 8, 8), {"kernel_shape": [3, 3], "p": 3, "pads": [1, 1, 1, 1]}),
    ("LpPool", (1, 2, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("GlobalAveragePool", (2, 3, 5, 4), {}),
    ("GlobalMaxPool", (2, 3, 5, 4, 3), {}),
    ("GlobalLpPool", (2, 3, 5, 4), {"p": 3}),
]


@pytest.mark.parametrize(("op", "xs", "attrs"), POOL_CASES)
def test_pool_matches_onnxruntime(harness: Harness, op, xs, attrs) -> None:
    x = _r(*xs)
    (want,) = harness.ort(op, [x], attrs)
    fn = harness.build(op, [x], attrs)
    got = fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if op in ("MaxPool", "AveragePool"):
        out = np.empty_like(want)
        assert fn(x, out=out) is out
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_match_onnxruntime(harness: Harness, storage_order) -> None:
    x = _r(2, 3, 7, 6)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}
    attrs["storage_order"] = storage_order
    want_y, want_i = harness.ort("MaxPool", [x], attrs, n_out=2)
    y, i = harness.build("MaxPool", [x], attrs, n_out=2)(x)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(i, want_i)
    assert i.dtype == np.int64


def test_maxpool_int8_and_avgpool_float16(harness: Harness) -> None:
    x = _RNG.integers(-128, 128, (1, 2, 6, 6)).astype(np.int8)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    (want,) = harness.ort("MaxPool", [x], attrs)
    np.testing.assert_array_equal(harness.build("MaxPool", [x], attrs)(x), want)
    x16 = _r(1, 2, 6, 6, dtype=np.float16)
    got = harness.build("AveragePool", [x16], attrs)(x16)
    assert got.dtype == np.float16
    (want16,) = harness.ort("AveragePool", [x16.astype(np.float32)], attrs)
    np.testing.assert_allclose(got, want16, rtol=2e-3, atol=2e-3)


def test_maxunpool_inverts_maxpool(harness: Harness) -> None:
    x = _r(1, 2, 6, 6)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    want_y, want_i = harness.ort("MaxPool", [x], attrs, n_out=2)
    fn = harness.build("MaxUnpool", [want_y, want_i], attrs)
    up = fn(want_y, want_i)
    (want,) = harness.ort("MaxUnpool", [want_y, want_i], attrs)
    np.testing.assert_array_equal(up, want)
