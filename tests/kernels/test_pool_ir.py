"""The max pool kernel (``kernels/lib/pool_ir.py``) for every window it builds, in every
vector width this host has, and the MaxPool plans that take it (``nn/pool_direct``).

Results are compared exactly with a NumPy reference (np.maximum over the window's taps of
the -inf padded planes) on random geometries with the edges: pads up to a window's width
less one (padding never wins), windows past the right and bottom ends, planes narrower than
a vector
and rows of both parities, NaN (wins its windows, as np.maximum) and -inf. A width the
host lacks is skipped with the reason; a test that expects the kernel checks it ran."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.jit_paths import need_lanes, spying_jitted
from tfrt_py.kernels.lib import pool_ir
from tfrt_py.kernels.lib.jit import jit_enabled, why_off
from tfrt_py.kernels.nn import pool_direct

RNG = np.random.default_rng(43)


def _reference(x: np.ndarray, oh: int, ow: int, pt: int, pl: int, window: Any) -> np.ndarray:
    kh, kw, st = window
    n, c, h, w = x.shape
    big_h, big_w = (oh - 1) * st + kh, (ow - 1) * st + kw
    xp = np.full((n, c, big_h + pt + h, big_w + pl + w), -np.inf, x.dtype)
    xp[:, :, pt : pt + h, pl : pl + w] = x
    y = np.full((n, c, oh, ow), -np.inf, x.dtype)
    for i in range(kh):
        for j in range(kw):
            y = np.maximum(y, xp[:, :, i : i + st * oh : st, j : j + st * ow : st][:, :, :oh, :ow])
    return y


def _geometries(window: Any, count: int) -> list[tuple[int, int, int, int, int, int]]:
    """(h, w, pt, pl, oh, ow) the kernel takes (``window_fits``), pads before and after
    from none to a window's width less one."""
    kh, kw, st = window
    out: list[tuple[int, int, int, int, int, int]] = []
    while len(out) < count:
        h, w = (int(v) for v in RNG.integers(1, 70, 2))
        pt, pb = (int(v) for v in RNG.integers(0, kh, 2))
        pl, pr = (int(v) for v in RNG.integers(0, kw, 2))
        oh, ow = (h + pt + pb - kh) // st + 1, (w + pl + pr - kw) // st + 1
        fits = pool_ir.window_fits((1, 1, h, w), (1, 1, oh, ow), (kh, kw), (st, st), (pt, pl))
        if oh >= 1 and ow >= 1 and fits:
            out.append((h, w, pt, pl, oh, ow))
    return out


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_every_width_pools_like_numpy(lanes: int) -> None:
    """The compiled function straight (ctypes) for every window it builds at this width,
    on random geometries of 1-3 planes, a twentieth of the values NaN in every third case,
    -inf runs in others; nothing written past the output."""
    need_lanes(lanes)
    engine = pool_ir.build(lanes)
    i64 = ctypes.c_int64
    fn = ctypes.CFUNCTYPE(i64, ctypes.c_void_p, ctypes.c_void_p, *[i64] * 8)(
        engine.get_function_address(pool_ir.SYMBOL)
    )
    built = 0
    for k, window in enumerate(pool_ir.WINDOWS):
        if pool_ir.window_index(window[:2], window[2:] * 2, lanes) != k:
            assert window[2] == 1 and window[1] > lanes + 1  # too wide for the vector
            continue
        built += 1
        for case, (h, w, pt, pl, oh, ow) in enumerate(_geometries(window, 40)):
            planes = 1 + case % 3
            x = RNG.standard_normal((1, planes, h, w)).astype(np.float32)
            if case % 3 == 0:
                x[RNG.random(x.shape) < 0.05] = np.nan
            elif case % 3 == 1:
                x[:, :, : h // 2, : w // 3] = -np.inf
            size = planes * oh * ow
            buf = np.full(size + 64, 5.0, np.float32)  # 64 guard floats after the output
            assert fn(x.ctypes.data, buf.ctypes.data, planes, h, w, oh, ow, pt, pl, k) == 0
            got = buf[:size].reshape(1, planes, oh, ow)
            want = _reference(x, oh, ow, pt, pl, window)
            np.testing.assert_array_equal(got, want, err_msg=f"{lanes} {window} {(h, w, pt, pl)}")
            assert (buf[size:] == 5.0).all()
    assert built >= 5
    assert fn(0, 0, 1, 1, 1, 1, 1, 0, 0, len(pool_ir.WINDOWS)) == 1  # no such window


def _need_kernel() -> None:
    if not jit_enabled():
        pytest.skip(f"compiled kernels are off here ({why_off()}): the NumPy fold runs")
    if pool_ir.kernel() is None:
        pytest.skip(f"the kernel is off here ({pool_ir.describe() or 'no llvmlite'})")


def _spied_run(mp: bytes, shape: Any, jitted: Any) -> tuple[np.ndarray, np.ndarray]:
    """The model's output on random feeds (``jitted``'s function checked to have run) and
    onnxruntime's."""
    x = RNG.standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(mp, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    model = tfrt_py.load(mp, executor="sync")
    with spying_jitted(jitted) as calls:
        got = model.run({"x": x})["y"]
    assert calls, f"the pool did not run {jitted.fn.__name__}"
    return got, want


def _pool_model(shape: tuple[int, ...], dtype: Any, **attrs: Any) -> bytes:
    t = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    g = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], **attrs)],
        "pool",
        [helper.make_tensor_value_info("x", t, list(shape))],
        [helper.make_tensor_value_info("y", t, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]).SerializeToString()


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 8, 56, 56), {"pads": [1, 1, 1, 1]}),  # ResNet's stem pool (two images)
        ((1, 16, 55, 55), {"ceil_mode": 1}),  # SqueezeNet's
        ((1, 24, 13, 13), {"ceil_mode": 1}),  # narrower than a vector
        ((1, 4, 20, 33), {"pads": [2, 0, 0, 2]}),
        ((2, 8, 28, 28), {"kernel_shape": [2, 2]}),  # VGG's, U-Net's
        ((1, 4, 27, 31), {"kernel_shape": [2, 2], "ceil_mode": 1}),
        ((1, 8, 28, 28), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1] * 4}),
        ((1, 8, 13, 13), {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2] * 4}),  # SPPF
        ((1, 8, 19, 19), {"kernel_shape": [9, 9], "strides": [1, 1], "pads": [4] * 4}),
    ],
)
def test_float32_pools_of_its_windows_run_the_kernel(shape: Any, attrs: dict[str, Any]) -> None:
    """A model's float32 MaxPool of a window the kernel builds (3x3 stride 2 unless the
    case says) takes the kernel (counted) and answers as onnxruntime does."""
    _need_kernel()
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], **attrs}
    window = (*attrs["kernel_shape"], attrs["strides"][0])
    if pool_ir.window_index(window[:2], window[2:] * 2, pool_ir.lanes()) < 0:
        pytest.skip(f"{window} is wider than this host's vectors allow")
    got, want = _spied_run(_pool_model(shape, np.float32, **attrs), shape, pool_direct._MAX_POOL_IR)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("shape", "dtype", "attrs"),
    [
        ((1, 2, 20, 20), np.float64, {"strides": [2, 2]}),  # not float32
        ((1, 2, 20, 20), np.float32, {"strides": [1, 2]}),  # unequal strides
        ((1, 2, 20, 20), np.float32, {"strides": [3, 3]}),  # stride 3
        ((1, 2, 20, 20), np.float32, {"strides": [2, 2], "pads": [3, 3, 0, 0]}),  # pads > 2
        # the last output row's window wholly below the plane (its rows are not clamped)
        ((1, 2, 4, 9), np.float32, {"strides": [2, 2], "pads": [0, 0, 3, 0]}),
    ],
)
@pytest.mark.compiles
def test_other_pools_keep_the_numba_loops(shape: Any, dtype: Any, attrs: dict[str, Any]) -> None:
    """What the kernel does not take plans on ``_max_pool2d`` (and still pools right)."""
    _need_kernel()
    kernel, strides = (3, 3), tuple(attrs["strides"])
    pads = attrs.get("pads", [0, 0, 0, 0])
    oh = (shape[2] + pads[0] + pads[2] - 3) // strides[0] + 1
    ow = (shape[3] + pads[1] + pads[3] - 3) // strides[1] + 1
    out_shape = (*shape[:2], oh, ow)
    plan = pool_direct.plan_max_pool(
        shape, kernel, out_shape, strides, (pads[0], pads[1]), (1, 1), np.dtype(dtype)
    )
    assert plan is not None and plan.fn is pool_direct._MAX_POOL.get()
    x = RNG.standard_normal(shape).astype(dtype)
    got = pool_direct.run_max_pool(plan, x, None)
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])),
                constant_values=-np.inf)  # fmt: skip
    want = np.full(out_shape, -np.inf, dtype)
    for i in range(3):
        for j in range(3):
            want = np.maximum(want, xp[:, :, i :: strides[0], j :: strides[1]][:, :, :oh, :ow])
    np.testing.assert_array_equal(got, want)


def test_the_feature_table_names_the_pool_width() -> None:
    """After a pool used it, ``describe()``'s packed-gemm line says the kernel's width."""
    _need_kernel()
    from tfrt_py.kernels.lib import gemm_packed
    from tfrt_py.kernels.lib.features import format_features

    if gemm_packed.kernel() is None:
        pytest.skip(f"the packed gemm is off here ({gemm_packed.path()[1]})")
    assert f"vectors of {pool_ir.lanes()} float32" in pool_ir.describe()
    (line,) = [ln for ln in format_features() if ln.startswith("packed gemm")]
    assert f"max pools: vectors of {pool_ir.lanes()} float32" in line


# -- AveragePool (nn/pool_avg.py) ------------------------------------------------------------


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_every_width_averages_like_numpy(lanes: int) -> None:
    """The average function straight (ctypes) for every window: each output is the sum of
    its taps inside the plane times its scale (a random plane here), pads past a window's
    width included (rows wholly outside add nothing), NaN and infinities propagating."""
    need_lanes(lanes)
    engine = pool_ir.build(lanes)
    i64, p = ctypes.c_int64, ctypes.c_void_p
    fn = ctypes.CFUNCTYPE(i64, p, p, *[i64] * 7, p, i64)(
        engine.get_function_address(pool_ir.SYMBOL_AVG)
    )
    for k, window in enumerate(pool_ir.WINDOWS):
        if pool_ir.window_index(window[:2], window[2:] * 2, lanes) != k:
            continue
        kh, kw, st = window
        for case in range(30):
            h, w = (int(v) for v in RNG.integers(1, 50, 2))
            pt, pb = (int(v) for v in RNG.integers(0, kh + 2, 2))  # a pad past the window
            pl, pr = (int(v) for v in RNG.integers(0, kw + 2, 2))
            oh, ow = (h + pt + pb - kh) // st + 1, (w + pl + pr - kw) // st + 1
            if oh < 1 or ow < 1:
                continue
            planes = 1 + case % 3
            x = RNG.standard_normal((1, planes, h, w)).astype(np.float32)
            if case % 5 == 0:
                x[0, 0, 0, 0] = np.nan
                x[0, -1, -1, -1] = np.inf
            scale = RNG.uniform(0.05, 1.0, (oh, ow)).astype(np.float32)
            size = planes * oh * ow
            buf = np.full(size + 64, 5.0, np.float32)
            args = (planes, h, w, oh, ow, pt, pl, scale.ctypes.data, k)
            assert fn(x.ctypes.data, buf.ctypes.data, *args) == 0
            xp = np.zeros((1, planes, h + pt + pb + kh + st, w + pl + pr + kw + st))
            xp[:, :, pt : pt + h, pl : pl + w] = x
            want = np.zeros((1, planes, oh, ow))
            for i in range(kh):
                for j in range(kw):
                    want += xp[:, :, i : i + st * oh : st, j : j + st * ow : st][:, :, :oh, :ow]
            got = buf[:size].reshape(1, planes, oh, ow)
            where = f"{lanes} {window} {(h, w, pt, pl, pb, pr)}"  # float32 sums of kh*kw taps
            np.testing.assert_allclose(got, want * scale, rtol=2e-6, atol=2e-6 * kh * kw,
                                       err_msg=where)  # fmt: skip
            assert (buf[size:] == 5.0).all()


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 8, 28, 28), {"kernel_shape": [2, 2], "strides": [2, 2]}),  # DenseNet's
        ((1, 8, 27, 29), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
        ((1, 8, 35, 35), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1] * 4}),
        (
            (1, 8, 17, 17),
            {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1] * 4, "count_include_pad": 1},
        ),
        (
            (1, 4, 20, 33),
            {
                "kernel_shape": [3, 3],
                "strides": [2, 2],
                "pads": [1, 0, 1, 1],
                "ceil_mode": 1,
                "count_include_pad": 1,
            },
        ),
    ],
)
def test_float32_average_pools_run_the_kernel(shape: Any, attrs: dict[str, Any]) -> None:
    """A model's float32 AveragePool of a window the kernel builds takes it (counted) and
    answers as onnxruntime does (to float32 rounding: the sums' order differs)."""
    _need_kernel()
    from tfrt_py.kernels.nn import pool_avg

    g = helper.make_graph(
        [helper.make_node("AveragePool", ["x"], ["y"], **attrs)],
        "avg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()
    got, want = _spied_run(mp, shape, pool_avg._AVG_POOL)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_other_average_pools_keep_the_numpy_fold() -> None:
    """float64, a dilated window and an unbuilt window get no compiled plan."""
    _need_kernel()
    from tfrt_py.kernels.nn import pool_avg

    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    x_shape, out = (1, 2, 20, 20), (1, 2, 9, 9)
    assert pool_avg.plan_avg_pool(x_shape, (3, 3), out, (2, 2), (0, 0), (1, 1), f64, 1 / 9) is None
    assert pool_avg.plan_avg_pool(x_shape, (3, 3), out, (2, 2), (0, 0), (2, 2), f32, 1 / 9) is None
    assert pool_avg.plan_avg_pool(x_shape, (4, 4), out, (2, 2), (0, 0), (1, 1), f32, 1 / 16) is None
    assert pool_avg.plan_avg_pool(x_shape, (3, 3), out, (2, 2), (0, 0), (1, 1), f32, 1 / 9)
