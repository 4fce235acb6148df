"""The compiled elementwise QOperator paths (``kernels/contrib/quantized_elementwise.py``)
against the NumPy formulas they must equal bit for bit: QLinearAdd/QLinearMul over equal
shapes and with a per-channel operand on either side (a squeeze-excitation scale: the
tiled-run kernel), QLinearGlobalAveragePool channels-last over pixels split between the
threads with pixels left after the whole runs. Codes at both type limits, zero points at
both ends."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfrt_py.kernels.contrib import quantized_elementwise as qe
from tfrt_py.kernels.contrib.quantized import _binary_params, _codes, _saturate
from tfrt_py.kernels.lib.quant import requantize

RNG = np.random.default_rng(39)
F32 = np.float32


def _need_compiled() -> None:
    if qe._BINARY.get() is None or qe._MEANS_LAST.get() is None:
        pytest.skip("numba's loops are off here ($TFRT_PY_JIT=0, no numba or no thread "
                    "layer): the NumPy formulas answer (test_contrib_quantized.py)")  # fmt: skip


def _binary_reference(add: bool, a: np.ndarray, b: np.ndarray, params: np.ndarray,
                      dt: Any) -> np.ndarray:  # fmt: skip
    za, zb, r0, r1, zc = (F32(v) for v in params[:5])
    ia, ib = _codes(a), _codes(b)
    r = (ia - za) * r0 + (ib - zb) * r1 if add else (ia - za) * (ib - zb) * r0
    return _saturate(r + zc, np.dtype(dt))


@pytest.mark.parametrize("add", [True, False], ids=["add", "mul"])
def test_binary_ops_equal_the_numpy_formula(add: bool) -> None:
    _need_compiled()
    cases = [  # a shape, b shape, whether the per-channel kernel takes them
        ((1, 9, 11, 24), (1, 9, 11, 24), None),
        ((1, 1, 1, 32), (1, 13, 11, 32), True),
        ((1, 13, 11, 144), (1, 1, 1, 144), False),
        ((1, 1, 1, 1152), (1, 7, 7, 1152), True),
        ((1, 1, 1, 3), (2, 5, 6, 3), True),
        ((2, 1, 1, 16), (2, 5, 5, 16), None),  # a batch's scales: image by image
        ((1, 40000), (1, 40000), None),  # one long run in blocks
    ]
    for case, (sa, sb, per_channel) in enumerate(cases):
        dt = (np.uint8, np.int8)[case % 2]
        info = np.iinfo(dt)
        a = RNG.integers(info.min, info.max + 1, sa).astype(dt)
        b = RNG.integers(info.min, info.max + 1, sb).astype(dt)
        a.reshape(-1)[:2] = info.min, info.max
        zps = [dt(v) for v in RNG.integers(info.min, info.max + 1, 3)]
        zps[case % 3] = dt(info.max if case % 2 else info.min)
        odt, params = _binary_params(add, np.dtype(dt), F32(RNG.uniform(0.001, 0.1)), zps[0],
                                     F32(RNG.uniform(0.001, 0.1)), zps[1],
                                     F32(RNG.uniform(0.001, 0.2)), zps[2])  # fmt: skip
        if sa != sb:  # equal shapes take the flat run first
            assert qe._per_channel(a, b) is per_channel, case
        got = qe.compiled_binary(add, a, b, params, odt)
        assert got is not None, case
        np.testing.assert_array_equal(got, _binary_reference(add, a, b, params, odt),
                                      err_msg=f"case {case}")  # fmt: skip


def test_channels_last_means_equal_the_int64_sums() -> None:
    _need_compiled()
    shapes = [(1, 112, 112, 32), (2, 7, 7, 1280), (1, 3, 5, 7), (1, 131, 129, 2),
              (3, 1, 1, 300), (1, 1, 70001, 1)]  # fmt: skip
    for case, shape in enumerate(shapes):
        dt = (np.uint8, np.int8)[case % 2]
        info = np.iinfo(dt)
        x = RNG.integers(info.min, info.max + 1, shape).astype(dt)
        if case == 0:
            x[...] = info.max  # the largest sums
        p = shape[1] * shape[2]
        zx = int((info.min, info.max)[case % 2])
        scale, zy = 0.02 / (0.05 * p), float(RNG.integers(0, 256))
        got = qe.channel_means(x, True, zx, scale, zy, np.dtype(np.uint8))
        acc = x.sum(axis=(1, 2), keepdims=True, dtype=np.int64) - np.int64(zx) * p
        want = requantize(acc, scale, np.uint8(zy), np.dtype(np.uint8))
        assert got is not None
        np.testing.assert_array_equal(got, want, err_msg=f"shape {shape}")
