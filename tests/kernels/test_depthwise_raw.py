"""``depthwise_ir``'s kernel as ctypes functions (``depthwise_ir.raw``), which the NumPy
paths' depthwise convs take once it is built (a cold start's stand-ins,
``conv.make_conv_core``): every kind, the main and the narrow build, images of odd and
even sizes and batches, against a float64 reference; and a stand-in's conv taking it (and
NumPy's taps before it is built, or with ``$TFRT_PY_JIT=0``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfrt_py.kernels.lib import depthwise_ir
from tfrt_py.kernels.nn import conv as conv_mod
from tfrt_py.kernels.nn import conv_depthwise_grid


def _raw() -> depthwise_ir.Raw:
    """The kernel's ctypes build (its main build, at least); skips where it is not built."""
    if depthwise_ir.function() is None:
        pytest.skip(
            "no depthwise grid kernel here (the portable path, TFRT_PY_PACKED_GEMM=0, "
            "or no llvmlite JIT)"
        )
    raw = depthwise_ir.raw()
    assert raw is not None and raw.vw == depthwise_ir.vector_width()
    return raw


def _reference(x: np.ndarray, w: np.ndarray, k: int, s: int) -> np.ndarray:
    """float64 sums over a zero-padded copy ("same" padding, K // 2 a side)."""
    n, c, h, wd = x.shape
    p = k // 2
    oh, ow = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    xp = np.zeros((n, c, h + 2 * p, wd + 2 * p))
    xp[:, :, p : p + h, p : p + wd] = x
    out = np.zeros((n, c, oh, ow))
    for i in range(k):
        for j in range(k):
            tap = xp[:, :, i : i + (oh - 1) * s + 1 : s, j : j + (ow - 1) * s + 1 : s]
            out += tap * w[None, :, i * k + j, None, None]
    return out


@pytest.mark.parametrize("kind", range(len(depthwise_ir.KINDS)))
@pytest.mark.parametrize(
    "n, c, h, wd", [(1, 3, 7, 7), (3, 5, 14, 14), (2, 17, 9, 30), (1, 2, 1, 1), (2, 4, 23, 6)]
)
def test_the_ctypes_kernel_is_the_definition(kind: int, n: int, c: int, h: int, wd: int) -> None:
    """Every kind at both builds' widths: outputs up to ``NARROW_MAX_WIDTH`` wide take the
    8-float build where it is built; the rest the main one."""
    k, s = depthwise_ir.KINDS[kind]
    raw = _raw()
    if depthwise_ir.vector_width() == 16:
        depthwise_ir.narrow_function()
        both = depthwise_ir.raw()
        assert both is not None and both.narrow is not None
        raw = both
    rng = np.random.default_rng(kind * 100 + c)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((c, k * k)).astype(np.float32)
    want = _reference(x, w, k, s)
    out = np.full(want.shape, np.nan, np.float32)
    assert conv_depthwise_grid.run_raw(raw, kind, x, w, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def _depthwise_core(k: int, s: int, c: int) -> Any:
    """``conv``'s NumPy core of a float32 depthwise conv (constant weights)."""
    from tfrt_py.ir.graph import Node
    from tfrt_py.kernels.base import KernelContext
    from tfrt_py.kernels.nn.conv_common import parse_spatial

    attrs = {"group": c, "pads": [k // 2] * 4, "strides": [s, s], "kernel_shape": [k, k]}
    ctx = KernelContext(Node("Conv", [], [], attrs, name="dw", opset=11))
    w = np.random.default_rng(1).standard_normal((c, 1, k, k)).astype(np.float32)
    core = conv_mod.make_conv_core(ctx, parse_spatial(ctx), c, w, np.dtype(np.float32))
    return core, w.reshape(c, k * k)


@pytest.mark.parametrize("k, s", [(3, 1), (5, 2)])
def test_a_numpy_depthwise_conv_takes_the_built_kernel(
    monkeypatch: pytest.MonkeyPatch, k: int, s: int
) -> None:
    """Once the kernel is built, the NumPy core runs it (a spy counts the calls) and
    answers as the definition does; without it (``raw()`` None) NumPy's taps answer."""
    raw = _raw()
    calls: list[int] = []
    real = conv_depthwise_grid.run_raw

    def spy(*args: Any) -> bool:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(conv_mod, "run_raw", spy)
    c = 6
    core, w2 = _depthwise_core(k, s, c)
    x = np.random.default_rng(2).standard_normal((2, c, 11, 12)).astype(np.float32)
    want = _reference(x, w2, k, s)
    np.testing.assert_allclose(core(x, None, None), want, rtol=1e-5, atol=1e-5)
    assert calls == [1]
    monkeypatch.setattr(depthwise_ir, "_RAW", None)
    np.testing.assert_allclose(core(x, None, None), want, rtol=1e-5, atol=1e-5)
    assert calls == [1]  # NumPy's taps
    monkeypatch.setattr(depthwise_ir, "_RAW", raw)
    monkeypatch.setenv("TFRT_PY_JIT", "0")
    core, _ = _depthwise_core(k, s, c)  # built with the compiled kernels off
    np.testing.assert_allclose(core(x, None, None), want, rtol=1e-5, atol=1e-5)
    assert calls == [1]
