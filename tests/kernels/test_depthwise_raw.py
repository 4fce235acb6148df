"""``depthwise_ir``'s kernel as ctypes functions (``depthwise_ir.raw``), which a depthwise
Conv's NumPy path takes once it is built (a cold start's stand-ins,
``conv_depthwise_grid.raw_depthwise_fn``): every kind, the main and the narrow build,
images of odd and even sizes and batches, against a float64 reference; the epilogues in
the kernel's store and after it; what it declines; and a Conv node built while the
compiled kernels are held taking it."""

from __future__ import annotations

import numpy as np
import pytest

from tfrt_py.ir.graph import Node
from tfrt_py.kernels.base import KernelContext
from tfrt_py.kernels.lib import depthwise_ir
from tfrt_py.kernels.lib.activations import Epilogue
from tfrt_py.kernels.nn import conv_depthwise_grid
from tfrt_py.kernels.nn.conv_common import ConvNode, parse_spatial
from tfrt_py.kernels.nn.conv_direct import apply_epilogue

from .held_conv import run_held_conv


def _raw() -> depthwise_ir.Raw:
    """The kernel's ctypes build (its main build, at least); skips where it is not built."""
    if depthwise_ir.function() is None:
        pytest.skip(
            "no depthwise grid kernel here (the portable path, TFRT_PY_PACKED_GEMM=0, "
            "or no llvmlite JIT)"
        )
    for kind in range(len(depthwise_ir.KINDS)):  # every kind and epilogue (built lazily)
        for code in depthwise_ir.CODES:
            assert depthwise_ir.ready(kind, code, narrow=True)
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
@pytest.mark.compiles
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


def _node(k: int, s: int, c: int, epi: Epilogue, bias: bool = True) -> ConvNode:
    """A float32 depthwise Conv node with constant weights (and bias), "same" padding."""
    attrs = {"group": c, "pads": [k // 2] * 4, "strides": [s, s], "kernel_shape": [k, k]}
    ctx = KernelContext(Node("Conv", [], [], attrs, name="dw", opset=11))
    rng = np.random.default_rng(1)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if bias else None
    return ConvNode(parse_spatial(ctx), c, w, b, np.dtype(np.float32), epi)


_EPILOGUES = [
    Epilogue(),
    Epilogue("Relu"),
    Epilogue("Clip", 0.0, 6.0),
    Epilogue("HardSwish"),
    Epilogue("HardSigmoid", 0.2, 0.5),
    Epilogue("SiLU"),
    Epilogue("Relu", residual=True),
    Epilogue("SiLU", residual=True),
]


@pytest.mark.parametrize("epi", _EPILOGUES, ids=lambda e: f"{e.act or 'none'}{'+r' * e.residual}")
@pytest.mark.parametrize("k, s", [(3, 1), (5, 2), (7, 1)])
def test_a_stand_in_depthwise_conv_runs_the_kernel_with_its_epilogue(
    epi: Epilogue, k: int, s: int
) -> None:
    """Bias, residual and the activation as the NumPy epilogue gives them: ReLU, Clip,
    HardSwish and HardSigmoid in the kernel's store, SiLU after it."""
    _raw()
    c = 6
    node = _node(k, s, c, epi)
    fn = conv_depthwise_grid.raw_depthwise_fn(node)
    assert fn is not None and node.w_const is not None and node.b_c is not None
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, c, 11, 12)).astype(np.float32) * 4
    conv = _reference(x, node.w_const.reshape(c, k * k), k, s).astype(np.float32)
    r = rng.standard_normal(conv.shape).astype(np.float32) if epi.residual else None
    want = apply_epilogue(conv.copy(), node.b_c, r, epi)
    got = fn(x, node.b_c, r, None)
    assert got is not None
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out = np.full(conv.shape, np.nan, np.float32)
    assert fn(x, node.b_c, r, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_stand_in_depthwise_conv_declines_what_the_kernel_does_not_serve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """None before the kernel is built, for a shape or dtype it does not serve, for a
    residual of another shape; no function at all for dilated or unsupported kernels and
    with ``$TFRT_PY_JIT=0`` (NumPy's taps then serve)."""
    raw = _raw()
    fn = conv_depthwise_grid.raw_depthwise_fn(_node(3, 1, 4, Epilogue()))
    assert fn is not None
    x = np.ones((1, 4, 5, 5), np.float32)
    assert fn(x, None, None, None) is not None
    assert fn(x.astype(np.float64), None, None, None) is None
    assert fn(np.ones((1, 3, 5, 5), np.float32), None, None, None) is None  # channels
    assert fn(x, None, np.ones((1, 4, 5, 4), np.float32), None) is None
    no_bias = conv_depthwise_grid.raw_depthwise_fn(_node(3, 1, 4, Epilogue(), bias=False))
    assert no_bias is not None and no_bias(x, np.ones(4, np.float32), None, None) is not None
    assert no_bias(x, np.ones(3, np.float32), None, None) is None  # a bias input one short
    monkeypatch.setattr(depthwise_ir, "_RAW", None)
    assert fn(x, None, None, None) is None
    monkeypatch.setattr(depthwise_ir, "_RAW", raw)
    assert conv_depthwise_grid.raw_depthwise_fn(_node(4, 1, 4, Epilogue())) is None  # 4x4
    monkeypatch.setenv("TFRT_PY_JIT", "0")
    assert conv_depthwise_grid.raw_depthwise_fn(_node(3, 1, 4, Epilogue())) is None


def test_a_conv_built_while_the_kernels_are_held_takes_the_built_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Conv node built and called while a cold start holds the compiled kernels (its
    stand-in: numba's depthwise declines) runs the kernel's ctypes build (a spy counts
    the calls) and answers as the definition does."""
    _raw()
    c, k = 5, 3
    rng = np.random.default_rng(3)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    x = rng.standard_normal((2, c, 9, 10)).astype(np.float32)
    want = _reference(x, w.reshape(c, k * k), k, 1) + b[None, :, None, None]
    attrs = {"group": c, "pads": [1, 1, 1, 1], "kernel_shape": [k, k]}
    got, calls = run_held_conv(monkeypatch, conv_depthwise_grid, "run_raw", w, b, x, attrs)
    assert calls == 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
