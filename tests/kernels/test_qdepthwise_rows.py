"""The depthwise row kernel (``kernels/lib/qdepthwise_ir.py``) in every vector-width form
this host has, and the channels-last depthwise QLinearConv built on it
(``nn/conv_qdepthwise``'s ring of staged rows).

Results are compared exactly with an int64 reference on random cases with the edges: codes
at both type limits, zero points at both ends, the largest sums the float32 form allows,
channel counts that are and are not whole vectors of 16 (the 8-channel tail), strides,
dilations and asymmetric pads, images tall enough that a band's ring of rows wraps. A form
the host lacks is skipped with the reason; a test that expects the kernel checks it ran."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.kernels.test_qgemm import _codes, _need_kernel, _reference, _run_nchw
from tfrt_py.kernels.lib import qdepthwise_ir
from tfrt_py.kernels.lib.quant import requantize
from tfrt_py.kernels.nn import conv_qdepthwise

RNG = np.random.default_rng(37)


def _host_forms() -> list[tuple[int, ...]]:
    try:
        return qdepthwise_ir.host_forms()
    except ImportError:  # no llvmlite
        return []


@pytest.mark.parametrize("lanes", [(16, 8), (8,)], ids=["avx512", "avx2"])
def test_every_form_computes_the_row_formula(lanes: tuple[int, ...]) -> None:
    """One output row straight through the compiled function (ctypes): for every window,
    the requantized sum of the taps over rows given by address (a ring's rows, out of
    order), strides 1 and 2, taps ``dj`` apart, at the sums' extremes."""
    if lanes not in _host_forms():
        pytest.skip(f"this host has no {'AVX-512F' if 16 in lanes else 'AVX2 and FMA'}")
    engine = qdepthwise_ir.build(lanes)
    p, n = ctypes.c_void_p, ctypes.c_int64
    for kh, kw in qdepthwise_ir.WINDOWS:
        fn = ctypes.CFUNCTYPE(n, p, n, n, n, p, p, p, p, p, n)(
            engine.get_function_address(qdepthwise_ir.SYMBOL.format(kh, kw))
        )
        for case, (c, step, dil, n_ow) in enumerate([(8, 1, 1, 5), (24, 2, 1, 7),
                                                     (40, 1, 2, 3), (16, 2, 2, 1)]):  # fmt: skip
            width = (n_ow - 1) * step + (kw - 1) * dil + 1
            rows = [RNG.integers(-255, 256, (width, c)).astype(np.float32) for _ in range(kh)]
            rows[0][:] = 255  # the largest sums against weights at -255
            w = RNG.integers(-255, 256, (kh, kw, c)).astype(np.float32)
            w[0] = -255
            bias = RNG.integers(-50000, 50000, c).astype(np.float32)
            scale = RNG.uniform(0.0005, 0.01, c).astype(np.float32)
            yz = np.array((0, 128, 255)[case % 3], np.uint8)
            params = np.array([0.0 - yz, 255.0 - yz, float(yz)], np.float32)
            order = RNG.permutation(kh)  # the rows live anywhere: stored shuffled
            store = np.stack([rows[i] for i in order])
            addrs = np.empty(kh, np.int64)
            for slot, i in enumerate(order):
                addrs[i] = store[slot].ctypes.data
            out = np.empty((n_ow, c), np.uint8)
            ptrs = [a.ctypes.data for a in (w, bias, scale, params, out)]
            assert fn(addrs.ctypes.data, c, dil * c, step * c, *ptrs, n_ow) == 0
            acc = np.tile(bias.astype(np.int64), (n_ow, 1))
            for i in range(kh):
                for j in range(kw):
                    taps = rows[i][j * dil : j * dil + (n_ow - 1) * step + 1 : step]
                    acc += taps.astype(np.int64) * w[i, j].astype(np.int64)
            want = requantize(acc, scale, yz, np.dtype(np.uint8))
            np.testing.assert_array_equal(out, want, err_msg=f"{lanes} {kh}x{kw} case {case}")


@pytest.mark.compiles
def test_channels_last_depthwise_runs_on_the_row_kernel_exactly() -> None:
    """The plans of 3x3, 5x5 and 7x7 depthwise convs over whole vectors of 8 channels take the
    row kernel (``kernel_rows``) and give the exact reference's answers: batch 2, strides,
    dilations, asymmetric pads, both input and output types, images tall enough that each
    band's ring of rows wraps. 17 channels, a 3x5 window, and sums past float32's exact
    range keep the numba loop, also exact."""
    _need_kernel(numba=True)
    if not qdepthwise_ir.widths():
        pytest.skip(f"no row kernel form in this process ({qdepthwise_ir.describe()})")
    cases = [  # c, h, w, kh, kw, stride, dilation, pads, row kernel
        (16, 30, 9, 3, 3, 1, 1, (1, 1, 1, 1), True),
        (24, 23, 14, 3, 3, 2, 1, (1, 0, 1, 1), True),
        (40, 19, 11, 5, 5, 1, 1, (2, 2, 2, 2), True),
        (32, 21, 13, 5, 5, 2, 1, (2, 1, 1, 2), True),
        (8, 17, 10, 3, 3, 1, 2, (2, 2, 2, 2), True),
        (48, 15, 9, 7, 7, 1, 1, (3, 3, 3, 3), True),  # ConvNeXt's window
        (16, 16, 13, 7, 7, 2, 1, (3, 2, 1, 3), True),
        (17, 12, 9, 3, 3, 1, 1, (1, 1, 1, 1), False),
        (16, 12, 9, 3, 5, 1, 1, (1, 2, 1, 2), False),
    ]
    for case, (c, h, w_, kh, kw, s, d, pads, rows) in enumerate(cases):
        xdt, ydt = (np.uint8, np.int8)[case % 2], (np.int8, np.uint8)[case % 2]
        wdt = (np.int8, np.uint8)[case // 2 % 2]
        x = _codes((2, c, h, w_), xdt)
        w = _codes((c, 1, kh, kw), wdt)
        x[0, :, :3] = np.iinfo(xdt).max
        w[: c // 2, 0, 0] = np.iinfo(wdt).min
        xz = np.array((np.iinfo(xdt).min, np.iinfo(xdt).max)[case % 2], xdt)
        yz = np.array((np.iinfo(ydt).max, np.iinfo(ydt).min)[case // 2 % 2], ydt)
        wz = (RNG.integers(np.iinfo(wdt).min, np.iinfo(wdt).max + 1, c) if case % 3 == 0 else
              np.full(c, 0 if wdt == np.int8 else 128)).astype(wdt)  # fmt: skip
        b = RNG.integers(-50000, 50000, c).astype(np.int32)
        xs, ys = np.array(0.02, np.float32), np.array(RNG.uniform(0.05, 2.0), np.float32)
        ws = RNG.uniform(0.001, 0.01, c).astype(np.float32)
        geo = (kh, kw, s, s, d, d, *pads)
        plan = conv_qdepthwise.plan_depthwise(w, ws, wz, xs, xz, ys, yz, b, geo)
        assert plan is not None and (plan.kernel_rows is not None) == rows, case
        want = _reference(x, xz, w, wz, b, xs, ws, ys, yz, geo)
        np.testing.assert_array_equal(_run_nchw(plan, x, True), want, err_msg=f"case {case}")
        lay = conv_qdepthwise._layout(plan, (2, h, w_, c), True)
        assert lay is not None
        if rows:  # bands of several rows: each band's ring of rows wraps
            assert lay[2] > 1, (case, lay)
    big = np.full(16, 2**24 - 100, np.int32)  # + 9 * 255**2 is past 2**24: int32 sums
    w = _codes((16, 1, 3, 3), np.int8)
    one = np.array(0.01, np.float32)
    plan = conv_qdepthwise.plan_depthwise(w, one, None, one, None, one, None, big,
                                          (3, 3, 1, 1, 1, 1, 1, 1, 1, 1))  # fmt: skip
    assert plan is not None and plan.sums == "int32" and plan.kernel_rows is None
