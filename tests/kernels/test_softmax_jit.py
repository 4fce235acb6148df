"""The compiled float32 Softmax rows (``kernels.softmax_jit``): agreement with
onnxruntime and with the NumPy path (``TFRT_PY_JIT=0``) on short rows (attention scores of
a short sequence, a classifier's logits) and long ones (ViT's 197, MobileViT's 256,
split over the threads when large), masked rows, the pre-13 flattened axis, the NaN/inf
rules on both loops, in-place calls, and the inputs it leaves to NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support.jit_paths import compiled_only
from tests.support.kernel_harness import Harness
from tfrt_py.kernels.lib.jit import ENV_JIT
from tfrt_py.kernels.lib.softmax_jit import SHORT_ROW, SPLIT_MIN_ELEMENTS, softmax_rows_f32
from tfrt_py.kernels.reduce import softmax

pytest.importorskip("numba", reason="the compiled kernel needs numba (the [native] extra)")

KERNEL_FAMILIES = (softmax,)
KERNEL_OPSET = 13
_RNG = np.random.default_rng(11)


def _fn(harness: Harness, x: np.ndarray, attrs: dict[str, Any], opset: int | None = None) -> Any:
    return harness.build("Softmax", [x], attrs, opset=opset)


def _both(
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    x: np.ndarray,
    attrs: dict[str, Any],
    opset: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    monkeypatch.setenv(ENV_JIT, "1")
    fast = _fn(harness, x, attrs, opset)(x)
    monkeypatch.setenv(ENV_JIT, "0")
    with np.errstate(invalid="ignore"):
        slow = _fn(harness, x, attrs, opset)(x)
    monkeypatch.setenv(ENV_JIT, "1")
    return fast, slow


@compiled_only
def test_kernel_compiles() -> None:
    assert softmax_rows_f32() is not None


@pytest.mark.parametrize(
    "shape",
    [
        (1, 4, 16, 16),
        (1, 12, 7, 7),
        (2, 3),
        (4, 1000),
        (1, 20000),
        (5,),
        (1, 3, 197, 197),
        (2, 4, 256, 256),
        (3, 71),
        (2, 65),
    ],
)
def test_rows_match_onnxruntime_and_numpy(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]
) -> None:
    x = (_RNG.standard_normal(shape) * 8).astype(np.float32)
    fast, slow = _both(harness, monkeypatch, x, {})
    (want,) = harness.ort("Softmax", [x], {})
    np.testing.assert_allclose(fast, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(fast, slow, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(fast.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("n", [9, 200])  # the flat loop and the row loop
def test_masked_rows_give_exact_zeros_and_the_nan_rules(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    x = _RNG.standard_normal((6, n)).astype(np.float32)
    x[0, 5:] = -np.inf  # a causal mask: exact zeros
    x[1, 2:] = -1e4  # an additive mask far below the max: zeros
    x[2, 4] = np.nan  # a NaN: the row is NaN
    x[3, :] = -np.inf  # every entry masked: NaN, as exp(-inf - -inf)
    x[4, 1] = np.inf  # +inf max: NaN
    fast, slow = _both(harness, monkeypatch, x, {})
    assert (fast[0, 5:] == 0).all() and (fast[1, 2:] == 0).all()
    np.testing.assert_allclose(fast[0, :5].sum(), 1.0, rtol=1e-6)
    assert np.isnan(fast[2:5]).all()
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(slow))
    ok = ~np.isnan(slow)
    np.testing.assert_allclose(fast[ok], slow[ok], rtol=2e-6, atol=1e-7)


def test_legacy_axis_flattens_the_trailing_axes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _RNG.standard_normal((3, 4, 5)).astype(np.float32)
    fast, slow = _both(harness, monkeypatch, x, {"axis": 1}, opset=11)
    (want,) = harness.ort("Softmax", [x], {"axis": 1}, opset=11)
    np.testing.assert_allclose(fast, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(fast.reshape(3, -1).sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(fast, slow, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("rows", [8, 300])  # 300 x 200 is split over the threads
def test_in_place_and_outputs_it_cannot_write(harness: Harness, rows: int) -> None:
    x = _RNG.standard_normal((rows, 200 if rows > 8 else 16)).astype(np.float32)
    fn = _fn(harness, x, {})
    want = fn(x)
    y = x.copy()
    assert fn(y, out=y) is y  # in place: the planner's out is x's buffer
    np.testing.assert_allclose(y, want, rtol=1e-6)
    big = np.zeros((x.shape[0], 2 * x.shape[1]), np.float32)
    r = fn(x, out=big[:, ::2])  # strided out: the NumPy path
    np.testing.assert_allclose(r, want, rtol=1e-6)
    np.testing.assert_allclose(fn(np.ascontiguousarray(x.T).T), want, rtol=1e-6)
    np.testing.assert_allclose(fn(x.astype(np.float64)), want, rtol=1e-6)  # float64: NumPy


@pytest.mark.parametrize("n", [16, 200])  # the flat loop, the row loop
@pytest.mark.parametrize("shift", [1, -3, 16, -16, 17])  # elements between x and out
def test_an_out_overlapping_the_input_in_part(harness: Harness, n: int, shift: int) -> None:
    """``out`` a view of the input's buffer at another offset: short rows read all of the
    input before writing (compiled, no overlap test); long rows go to NumPy's ufuncs,
    which copy what overlaps. Either way the result is the input's softmax."""
    rows = 12
    x = _RNG.standard_normal((rows, n)).astype(np.float32)
    want = _fn(harness, x, {})(x)
    buf = np.zeros(rows * n + 64, np.float32)
    at = 32
    xv = buf[at : at + rows * n].reshape(rows, n)
    xv[...] = x
    out = buf[at + shift : at + shift + rows * n].reshape(rows, n)
    got = _fn(harness, x, {})(xv, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@compiled_only
def test_short_rows_of_a_large_input_take_the_compiled_rows(
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A classifier's probabilities over a big batch: many rows of a few classes, where
    NumPy's per-row reductions cost most."""
    x = (_RNG.standard_normal((4096, 4)) * 8).astype(np.float32)
    assert x.shape[1] <= SHORT_ROW
    real = softmax_rows_f32()
    calls: list[tuple[int, ...]] = []

    def counting(a: np.ndarray, b: np.ndarray) -> None:
        calls.append(a.shape)
        real(a, b)

    monkeypatch.setattr(softmax, "softmax_rows_f32", lambda: counting)
    got = _fn(harness, x, {})(x)
    assert calls == [(4096, 4)]
    (want,) = harness.ort("Softmax", [x], {})
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_large_inputs_split_their_rows(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """MobileViT's attention scores: long rows, past the split threshold; every row is
    the same whether a helper or the caller computed it."""
    x = (_RNG.standard_normal((4, 4, 256, 256)) * 4).astype(np.float32)
    assert x.size >= SPLIT_MIN_ELEMENTS and x.shape[-1] > SHORT_ROW
    fast, slow = _both(harness, monkeypatch, x, {})
    np.testing.assert_allclose(fast, slow, rtol=2e-6, atol=1e-7)
    one = np.concatenate([_fn(harness, r, {})(r) for r in x.reshape(-1, 8, 256)])
    np.testing.assert_array_equal(fast.reshape(-1, 256), one.reshape(-1, 256))
