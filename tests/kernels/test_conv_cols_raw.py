"""``gemm_cols``'s kernel as a ctypes function (``gemm_cols.raw``), which a one-group
float32 Conv's NumPy path takes once it is built (a cold start's stand-ins,
``conv_cols_raw.raw_cols_fn``): each of its forms (DIRECT, GRID, IM2COL) over strides,
dilations, asymmetric pads, kernels of 1x1 to 7x7, odd planes and batches, against a
float64 reference; the epilogues in the kernel's store and after it; what it declines;
and a Conv node built while the compiled kernels are held taking it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfrt_py.ir.graph import Node
from tfrt_py.kernels.base import KernelContext
from tfrt_py.kernels.lib import gemm_cols
from tfrt_py.kernels.lib.activations import Epilogue
from tfrt_py.kernels.nn import conv_cols_raw
from tfrt_py.kernels.nn.conv_common import ConvNode, parse_spatial
from tfrt_py.kernels.nn.conv_direct import apply_epilogue

from .held_conv import run_held_conv


def _built() -> None:
    """Builds the kernel (and with it its ctypes function); skips where there is none."""
    if not gemm_cols.available():
        pytest.skip(
            "no gemm_cols kernel here (the portable path, TFRT_PY_PACKED_GEMM=0, "
            "or no llvmlite JIT)"
        )
    raw = gemm_cols.raw()
    assert raw is not None and raw.nr == gemm_cols.panel_width()


def _reference(x: np.ndarray, w: np.ndarray, strides: tuple[int, int],
               dil: tuple[int, int], pads: tuple[int, int, int, int]) -> np.ndarray:  # fmt: skip
    """float64 sums over a zero-padded copy, one tap at a time."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dil
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]))
    xp[:, :, pads[0] : pads[0] + h, pads[1] : pads[1] + wd] = x
    oh = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[3] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            tap = xp[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh,
                     j * dw : j * dw + (ow - 1) * sw + 1 : sw]  # fmt: skip
            out += np.einsum("nchw,mc->nmhw", tap, w[:, :, i, j].astype(np.float64))
    return out


def _node(w: np.ndarray, strides: tuple[int, int], dil: tuple[int, int],
          pads: tuple[int, int, int, int], epi: Epilogue,
          b: np.ndarray | None) -> ConvNode:  # fmt: skip
    attrs = {"pads": list(pads), "strides": list(strides), "dilations": list(dil),
             "kernel_shape": list(w.shape[2:])}  # fmt: skip
    ctx = KernelContext(Node("Conv", [], [], attrs, name="conv", opset=11))
    return ConvNode(parse_spatial(ctx), 1, w, b, np.dtype(np.float32), epi)


#: (N, C, H, W, M, kernel, strides, dilations, pads, the form it takes)
_CASES = [
    (2, 8, 9, 11, 5, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), conv_cols_raw.DIRECT),
    (1, 3, 7, 7, 40, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), conv_cols_raw.DIRECT),
    (3, 6, 10, 13, 17, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), conv_cols_raw.GRID),
    (2, 4, 8, 9, 3, (3, 3), (1, 1), (2, 2), (2, 1, 0, 3), conv_cols_raw.GRID),
    (1, 5, 6, 6, 7, (2, 3), (1, 1), (1, 1), (0, 0, 0, 0), conv_cols_raw.GRID),
    (1, 2, 5, 5, 4, (1, 1), (1, 1), (1, 1), (1, 0, 2, 1), conv_cols_raw.GRID),
    (2, 3, 23, 21, 16, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3), conv_cols_raw.IM2COL),
    (2, 8, 14, 14, 33, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), conv_cols_raw.IM2COL),
    (1, 9, 12, 10, 6, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0), conv_cols_raw.IM2COL),
    (2, 3, 16, 16, 12, (4, 4), (4, 4), (1, 1), (0, 0, 0, 0), conv_cols_raw.IM2COL),
    (1, 4, 9, 15, 5, (3, 3), (1, 2), (2, 1), (1, 2, 0, 1), conv_cols_raw.IM2COL),
]


@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]}-{c[5]}s{c[6]}")
def test_each_form_is_the_definition(case: tuple[Any, ...]) -> None:
    """Every form at odd sizes (the kernel's partial panels), with bias; the plan takes the
    form the case names (``conv_cols_raw._plan``)."""
    n, c, h, wd, m, k, s, d, p, form = case
    _built()
    rng = np.random.default_rng(h * 10 + m)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((m, c, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    node = _node(w, s, d, p, Epilogue(), b)
    plan = conv_cols_raw._plan(x.shape, w.shape, node.sp)
    assert plan is not None and plan.mode == form
    fn = conv_cols_raw.raw_cols_fn(node)
    assert fn is not None
    got = fn(x, b, None, None)
    assert got is not None
    want = _reference(x, w, s, d, p) + b[None, :, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


_EPILOGUES = [
    Epilogue(),
    Epilogue("Relu"),
    Epilogue("Clip", 0.0, 6.0),
    Epilogue("SiLU"),
    Epilogue("Relu", residual=True),
    Epilogue("Clip", -1.0, 1.0, residual=True),
    Epilogue("HardSwish", residual=True),
]


@pytest.mark.parametrize("epi", _EPILOGUES, ids=lambda e: f"{e.act or 'none'}{'+r' * e.residual}")
@pytest.mark.parametrize(
    "case", [_CASES[0], _CASES[2], _CASES[7]], ids=["direct", "grid", "im2col"]
)
@pytest.mark.parametrize("bias", [True, False])
def test_the_epilogue_is_the_numpy_epilogue(epi: Epilogue, case: tuple[Any, ...],
                                            bias: bool) -> None:  # fmt: skip
    """Bias, residual and the activation as the NumPy epilogue gives them, into a fresh
    array and into the caller's ``out``."""
    _built()
    check_epilogue(conv_cols_raw.raw_cols_fn, case[:9], epi, bias)


def check_epilogue(make_fn: Any, case: tuple[Any, ...], epi: Epilogue, bias: bool) -> None:
    """``make_fn(node)``'s conv of ``case`` (N, C, H, W, M, kernel, strides, dilations,
    pads) with ``epi`` (a bias where ``bias``) answers as the NumPy epilogue over the
    float64 definition, into a fresh array and into the caller's ``out``."""
    n, c, h, wd, m, k, s, d, p = case
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((m, c, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    fn = make_fn(_node(w, s, d, p, epi, b))
    assert fn is not None
    conv = _reference(x, w, s, d, p).astype(np.float32)
    r = rng.standard_normal(conv.shape).astype(np.float32) if epi.residual else None
    want = apply_epilogue(conv.copy(), b, r, epi)
    got = fn(x, b, r, None)
    assert got is not None
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    out = np.full(conv.shape, np.nan, np.float32)
    assert fn(x, b, r, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_what_it_declines(monkeypatch: pytest.MonkeyPatch) -> None:
    """None before the kernel is built, for another dtype or channel count, a residual of
    another shape, a bias input of another length; no function at all for grouped or
    non-float32 convs and with ``$TFRT_PY_JIT=0``."""
    _built()
    w = np.ones((4, 3, 3, 3), np.float32)
    fn = conv_cols_raw.raw_cols_fn(_node(w, (1, 1), (1, 1), (1, 1, 1, 1), Epilogue(), None))
    assert fn is not None
    x = np.ones((1, 3, 5, 5), np.float32)
    assert fn(x, None, None, None) is not None
    assert fn(x.astype(np.float64), None, None, None) is None
    assert fn(np.ones((1, 2, 5, 5), np.float32), None, None, None) is None
    assert fn(x, None, np.ones((1, 4, 5, 4), np.float32), None) is None
    assert fn(x, np.ones(3, np.float32), None, None) is None  # a bias input one short
    assert fn(x, np.ones(4, np.float32), None, None) is not None
    empty = np.zeros((4, 0, 3, 3), np.float32)  # no channels: K = 0 (the kernel divides by it)
    no_c = conv_cols_raw.raw_cols_fn(_node(empty, (1, 1), (1, 1), (1, 1, 1, 1), Epilogue(), None))
    assert no_c is not None and no_c(np.ones((1, 0, 5, 5), np.float32), None, None, None) is None
    raw = gemm_cols.raw()
    monkeypatch.setattr(gemm_cols, "_RAW", None)
    assert fn(x, None, None, None) is None
    monkeypatch.setattr(gemm_cols, "_RAW", raw)
    grouped = _node(np.ones((4, 1, 3, 3), np.float32), (1, 1), (1, 1), (1, 1, 1, 1),
                    Epilogue(), None)._replace(group=3)  # fmt: skip
    assert conv_cols_raw.raw_cols_fn(grouped) is None
    f64 = _node(w, (1, 1), (1, 1), (1, 1, 1, 1), Epilogue(), None)._replace(
        cdt=np.dtype(np.float64)
    )
    assert conv_cols_raw.raw_cols_fn(f64) is None
    monkeypatch.setenv("TFRT_PY_JIT", "0")
    assert conv_cols_raw.raw_cols_fn(_node(w, (1, 1), (1, 1), (1, 1, 1, 1), Epilogue(),
                                           None)) is None  # fmt: skip


def test_a_conv_built_while_the_kernels_are_held_takes_the_built_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ResNet-style Conv (3x3, pads 1, bias, ReLU fused by the graph's rewrite or not)
    built and called while a cold start holds the compiled kernels (its stand-in: numba's
    paths decline) runs the kernel's ctypes build (a spy counts the calls) and answers as
    the definition does."""
    _built()
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    x = rng.standard_normal((2, 4, 9, 10)).astype(np.float32)
    want = _reference(x, w, (1, 1), (1, 1), (1, 1, 1, 1)) + b[None, :, None, None]
    attrs = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    got, calls = run_held_conv(monkeypatch, conv_cols_raw, "_run", w, b, x, attrs)
    assert calls == 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group_bytes", [1, 20_000, 1 << 24])
@pytest.mark.parametrize("case", [_CASES[2], _CASES[6], _CASES[7]], ids=["grid", "im2col-stem",
                                                                       "im2col"])  # fmt: skip
def test_images_in_groups_are_the_definition(case: tuple[Any, ...], group_bytes: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Groups of one image, of a few, and the whole batch (``GROUP_BYTES``) give the same
    answer, the residual of each image added to its own output."""
    _, c, h, wd, m, k, s, d, p, _ = case
    _built()
    monkeypatch.setattr(conv_cols_raw, "GROUP_BYTES", group_bytes)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((m, c, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    epi = Epilogue("Relu", residual=True)
    fn = conv_cols_raw.raw_cols_fn(_node(w, s, d, p, epi, b))
    assert fn is not None
    conv = _reference(x, w, s, d, p).astype(np.float32)
    r = rng.standard_normal(conv.shape).astype(np.float32)
    got = fn(x, b, r, None)
    assert got is not None
    np.testing.assert_allclose(got, apply_epilogue(conv.copy(), b, r, epi), rtol=1e-4, atol=1e-4)


def test_raw_operands_write_only_a_buffer_of_the_output_shape() -> None:
    """The ctypes kernels write ``out_shape``'s floats into the operands' ``y``: a caller's
    buffer of another shape, dtype or layout is never it (a residual's broadcast shape
    would be written in the wrong layout, a smaller buffer past its end)."""
    from tfrt_py.kernels.nn.conv_common import raw_operands

    x = np.zeros((1, 2, 4, 4), np.float32)
    shape = (1, 3, 4, 4)
    same = np.empty(shape, np.float32)
    ops = raw_operands(x, None, same, shape)
    assert ops is not None and ops.y is same
    for other in (
        np.empty((2, 3, 4, 4), np.float32),
        np.empty((1, 3, 2, 4), np.float32),
        np.empty(shape, np.float64),
        np.empty((1, 3, 4, 8), np.float32)[..., ::2],
    ):
        ops = raw_operands(x, None, other, shape)
        assert ops is not None and ops.y is not other and ops.y.shape == shape
