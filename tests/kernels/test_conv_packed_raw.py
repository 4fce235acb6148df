"""``gemm_indirect``'s kernels as ctypes functions (``gemm_indirect.raw``), which a
one-group float32 Conv's NumPy path takes once they are built (a cold start's stand-ins,
``conv_packed_raw.raw_packed_fn``): strides, dilations, asymmetric pads, a stem of three
channels, few-pixel 1x1 convs, filters not a whole panel, batches in chunks, against a
float64 reference; the epilogues in the kernel's store and after it; what it declines;
and a Conv node built while the compiled kernels are held taking it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfrt_py.kernels.lib import gemm_indirect
from tfrt_py.kernels.lib.activations import Epilogue
from tfrt_py.kernels.nn import conv_packed, conv_packed_raw
from tfrt_py.kernels.nn.conv_direct import apply_epilogue

from .held_conv import run_held_conv
from .test_conv_cols_raw import _EPILOGUES, _node, _reference, check_epilogue


def _built() -> gemm_indirect.Raw:
    """Builds the kernels (and with them their ctypes functions); skips where there are
    none, or where the build stores rows (the route needs the NCHW stores)."""
    if not gemm_indirect.available():
        pytest.skip("no gemm_indirect kernel here (the portable path, TFRT_PY_PACKED_GEMM=0, "
                    "or no llvmlite JIT)")  # fmt: skip
    raw = gemm_indirect.raw()
    assert raw is not None
    if not gemm_indirect.nchw_stores():
        pytest.skip("this host's build stores rows, not NCHW (the AVX-512 tile's stores): "
                    "the route declines there")  # fmt: skip
    return raw


#: (N, C, H, W, M, kernel, strides, dilations, pads)
_CASES = [
    (2, 64, 9, 11, 64, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # ResNet's 3x3, odd plane
    (1, 16, 13, 13, 40, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # 40 filters: a part panel
    (2, 24, 15, 12, 64, (3, 3), (2, 2), (1, 1), (0, 1, 1, 0)),  # strided, asymmetric pads
    (1, 32, 10, 10, 32, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),  # dilated
    (2, 3, 30, 28, 64, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),  # a stem of three channels
    (3, 64, 7, 7, 160, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),  # a few-pixel 1x1
    (1, 128, 14, 13, 128, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),  # a strided 1x1
]


def _ids(c: tuple[Any, ...]) -> str:
    return f"{c[0]}x{c[1]}x{c[2]}x{c[3]}-{c[4]}-{c[5][0]}s{c[6][0]}d{c[7][0]}"


@pytest.mark.parametrize("case", _CASES, ids=_ids)
def test_each_case_is_the_definition(case: tuple[Any, ...]) -> None:
    """Each case at odd sizes, with bias, is served (the plan is made) and answers as the
    float64 definition does."""
    n, c, h, wd, m, k, s, d, p = case
    raw = _built()
    rng = np.random.default_rng(h * 10 + m)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((m, c, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    node = _node(w, s, d, p, Epilogue(), b)
    assert conv_packed_raw._plan(x.shape, w.shape, node.sp, raw.shape) is not None
    fn = conv_packed_raw.raw_packed_fn(node)
    assert fn is not None
    got = fn(x, b, None, None)
    assert got is not None
    want = _reference(x, w, s, d, p) + b[None, :, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("epi", _EPILOGUES, ids=lambda e: f"{e.act or 'none'}{'+r' * e.residual}")
@pytest.mark.parametrize("case", [_CASES[0], _CASES[1], _CASES[5]], ids=["3x3", "part", "1x1"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_epilogue_is_the_numpy_epilogue(epi: Epilogue, case: tuple[Any, ...],
                                            bias: bool) -> None:  # fmt: skip
    """Bias, residual and the activation as the NumPy epilogue gives them (ReLU and Clip
    in the kernel's stores, the others after), into a fresh array and into the caller's
    ``out``."""
    _built()
    check_epilogue(conv_packed_raw.raw_packed_fn, case, epi, bias)


@pytest.mark.parametrize(("tap_floats", "chunk"),
                         [(1, 1), (2 * 99 * 576, 2), (1 << 22, 5)])  # fmt: skip
def test_a_batch_in_chunks_is_the_definition(tap_floats: int, chunk: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Chunks of one image, of two (a shorter last one) and the whole batch
    (``conv_packed``'s chunks, one copy call and one product call each) give the same
    answer, each image's residual added to its own output."""
    raw = _built()
    monkeypatch.setattr(conv_packed, "CHUNK_TAP_FLOATS", tap_floats)
    _, c, h, wd, m, k, s, d, p = _CASES[0]
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((m, c, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    epi = Epilogue("Relu", residual=True)
    node = _node(w, s, d, p, epi, b)
    plan = conv_packed_raw._plan(x.shape, w.shape, node.sp, raw.shape)
    assert plan is not None and plan.chunk == chunk
    fn = conv_packed_raw.raw_packed_fn(node)
    assert fn is not None
    conv = _reference(x, w, s, d, p).astype(np.float32)
    r = rng.standard_normal(conv.shape).astype(np.float32)
    got = fn(x, b, r, None)
    assert got is not None
    np.testing.assert_allclose(got, apply_epilogue(conv.copy(), b, r, epi), rtol=1e-4, atol=1e-4)


def test_what_it_declines(monkeypatch: pytest.MonkeyPatch) -> None:
    """None before the kernels are built, for another dtype or channel count, a residual
    of another shape, a bias input of another length, a 1x1 conv over many pixels
    (``conv_cols``' conv); no function at all for grouped, non-float32 or few-tap (K under
    ``MIN_K``) convs and with ``$TFRT_PY_JIT=0``."""
    _built()
    w = np.ones((64, 16, 3, 3), np.float32)
    fn = conv_packed_raw.raw_packed_fn(_node(w, (1, 1), (1, 1), (1, 1, 1, 1), Epilogue(), None))
    assert fn is not None
    x = np.ones((1, 16, 5, 5), np.float32)
    assert fn(x, None, None, None) is not None
    assert fn(x.astype(np.float64), None, None, None) is None
    assert fn(np.ones((1, 8, 5, 5), np.float32), None, None, None) is None
    assert fn(x, None, np.ones((1, 64, 5, 4), np.float32), None) is None
    assert fn(x, np.ones(63, np.float32), None, None) is None  # a bias input one short
    assert fn(x, np.ones(64, np.float32), None, None) is not None
    wide = np.ones((64, 64, 1, 1), np.float32)
    pointwise = conv_packed_raw.raw_packed_fn(_node(wide, (1, 1), (1, 1), (0, 0, 0, 0),
                                                    Epilogue(), None))  # fmt: skip
    assert pointwise is not None
    assert pointwise(np.ones((1, 64, 20, 20), np.float32), None, None, None) is None
    raw = gemm_indirect.raw()
    monkeypatch.setattr(gemm_indirect, "_RAW", None)
    assert fn(x, None, None, None) is None
    monkeypatch.setattr(gemm_indirect, "_RAW", raw)
    grouped = _node(np.ones((64, 8, 3, 3), np.float32), (1, 1), (1, 1), (1, 1, 1, 1),
                    Epilogue(), None)._replace(group=2)  # fmt: skip
    assert conv_packed_raw.raw_packed_fn(grouped) is None
    f64 = _node(w, (1, 1), (1, 1), (1, 1, 1, 1), Epilogue(), None)._replace(
        cdt=np.dtype(np.float64)
    )
    assert conv_packed_raw.raw_packed_fn(f64) is None
    few = np.ones((64, 4, 3, 3), np.float32)  # K = 36
    assert conv_packed_raw.raw_packed_fn(_node(few, (1, 1), (1, 1), (1, 1, 1, 1), Epilogue(),
                                               None)) is None  # fmt: skip
    monkeypatch.setenv("TFRT_PY_JIT", "0")
    assert conv_packed_raw.raw_packed_fn(_node(w, (1, 1), (1, 1), (1, 1, 1, 1), Epilogue(),
                                               None)) is None  # fmt: skip


def test_a_conv_built_while_the_kernels_are_held_takes_the_built_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ResNet-style Conv (64 -> 64 channels, 3x3, pads 1, bias) built and called while a
    cold start holds the compiled kernels (its stand-in: numba's paths decline) runs the
    kernels' ctypes build (a spy counts the calls), ahead of ``conv_cols_raw``, and
    answers as the definition does; building it notes the kernels for the warm-up."""
    _built()
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    x = rng.standard_normal((2, 64, 9, 10)).astype(np.float32)
    want = _reference(x, w, (1, 1), (1, 1), (1, 1, 1, 1)) + b[None, :, None, None]
    attrs = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    gemm_indirect.WANTED.clear()
    got, calls = run_held_conv(monkeypatch, conv_packed_raw, "_run", w, b, x, attrs)
    assert calls == 1
    assert gemm_indirect.WANTED.is_set()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
