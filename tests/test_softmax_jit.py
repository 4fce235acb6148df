"""The compiled float32 Softmax rows (``kernels.softmax_jit``): agreement with
onnxruntime and with the NumPy path (``TFRT_PY_JIT=0``) on the small inputs it takes
(attention scores of a short sequence, masked rows, few long rows, the pre-13 flattened
axis), the NaN/inf rules, in-place calls, and the inputs it leaves to NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support.kernel_harness import build_node, ort_run, registry_of
from tfrt_py.kernels.jit import ENV_JIT
from tfrt_py.kernels.reduce import softmax
from tfrt_py.kernels.softmax_jit import MAX_ELEMENTS, SHORT_ROW, softmax_rows_f32

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("numba", reason="the compiled kernel needs numba (the [native] extra)")

_REG = registry_of(softmax)
_RNG = np.random.default_rng(11)


def _fn(x: np.ndarray, attrs: dict[str, Any], opset: int = 13) -> Any:
    return build_node(_REG, "Softmax", [x], attrs, opset=opset)


def _both(monkeypatch: pytest.MonkeyPatch, x: np.ndarray, attrs: dict[str, Any],
          opset: int = 13) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    monkeypatch.setenv(ENV_JIT, "1")
    fast = _fn(x, attrs, opset)(x)
    monkeypatch.setenv(ENV_JIT, "0")
    with np.errstate(invalid="ignore"):
        slow = _fn(x, attrs, opset)(x)
    monkeypatch.setenv(ENV_JIT, "1")
    return fast, slow


def test_kernel_compiles() -> None:
    assert softmax_rows_f32() is not None


@pytest.mark.parametrize(
    "shape", [(1, 4, 16, 16), (1, 12, 7, 7), (2, 3), (4, 1000), (1, 20000), (5,)]
)
def test_rows_match_onnxruntime_and_numpy(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]
) -> None:
    x = (_RNG.standard_normal(shape) * 8).astype(np.float32)
    fast, slow = _both(monkeypatch, x, {})
    (want,) = ort_run("Softmax", [x], {}, opset=13)
    np.testing.assert_allclose(fast, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(fast, slow, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(fast.sum(axis=-1), 1.0, rtol=1e-5)


def test_masked_rows_give_exact_zeros_and_the_nan_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _RNG.standard_normal((6, 9)).astype(np.float32)
    x[0, 5:] = -np.inf  # a causal mask: exact zeros
    x[1, 2:] = -1e4  # an additive mask far below the max: zeros
    x[2, 4] = np.nan  # a NaN: the row is NaN
    x[3, :] = -np.inf  # every entry masked: NaN, as exp(-inf - -inf)
    x[4, 1] = np.inf  # +inf max: NaN
    fast, slow = _both(monkeypatch, x, {})
    assert (fast[0, 5:] == 0).all() and (fast[1, 2:] == 0).all()
    np.testing.assert_allclose(fast[0, :5].sum(), 1.0, rtol=1e-6)
    assert np.isnan(fast[2:5]).all()
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(slow))
    ok = ~np.isnan(slow)
    np.testing.assert_allclose(fast[ok], slow[ok], rtol=2e-6, atol=1e-7)


def test_legacy_axis_flattens_the_trailing_axes(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _RNG.standard_normal((3, 4, 5)).astype(np.float32)
    fast, slow = _both(monkeypatch, x, {"axis": 1}, opset=11)
    (want,) = ort_run("Softmax", [x], {"axis": 1}, opset=11)
    np.testing.assert_allclose(fast, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(fast.reshape(3, -1).sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(fast, slow, rtol=2e-6, atol=1e-7)


def test_in_place_and_outputs_it_cannot_write() -> None:
    x = _RNG.standard_normal((8, 16)).astype(np.float32)
    fn = _fn(x, {})
    want = fn(x)
    y = x.copy()
    assert fn(y, out=y) is y  # in place: the planner's out is x's buffer
    np.testing.assert_allclose(y, want, rtol=1e-6)
    big = np.zeros((8, 32), np.float32)
    r = fn(x, out=big[:, ::2])  # strided out: the NumPy path
    np.testing.assert_allclose(r, want, rtol=1e-6)
    np.testing.assert_allclose(fn(np.ascontiguousarray(x.T).T), want, rtol=1e-6)
    np.testing.assert_allclose(fn(x.astype(np.float64)), want, rtol=1e-6)  # float64: NumPy


def test_short_rows_of_a_large_input_take_the_compiled_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A classifier's probabilities over a big batch: many rows of a few classes, where
    NumPy's per-row reductions cost most."""
    x = (_RNG.standard_normal((4096, 4)) * 8).astype(np.float32)
    assert x.size > MAX_ELEMENTS and x.shape[1] <= SHORT_ROW
    real = softmax_rows_f32()
    calls: list[tuple[int, ...]] = []

    def counting(a: np.ndarray, b: np.ndarray) -> None:
        calls.append(a.shape)
        real(a, b)

    monkeypatch.setattr(softmax, "softmax_rows_f32", lambda: counting)
    got = _fn(x, {})(x)
    assert calls == [(4096, 4)]
    (want,) = ort_run("Softmax", [x], {}, opset=13)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_large_inputs_keep_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _RNG.standard_normal((64, MAX_ELEMENTS // 32)).astype(np.float32)
    fast, slow = _both(monkeypatch, x, {})
    np.testing.assert_array_equal(fast, slow)  # the same NumPy passes ran both times
