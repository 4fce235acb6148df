"""The compiled LayerNormalization and RMS rows (``kernels.norm_jit``): the kernels agree with
onnxruntime and with the NumPy path (``TFRT_PY_JIT=0``) on float32 and float64, with and
without bias, on the axes and parameter shapes exporters write; calls it does not fit
(non-contiguous input, parameters that grow the result, an aliasing ``out``) take the
NumPy path and still agree."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support.jit_paths import compiled_only, spy_served
from tests.support.kernel_harness import Harness
from tfrt_py.kernels.lib.jit import ENV_JIT
from tfrt_py.kernels.lib.norm_jit import layer_norm_rows, rms_norm_rows
from tfrt_py.kernels.nn import norm

pytest.importorskip("numba", reason="the compiled kernel needs numba (the [native] extra)")

KERNEL_FAMILIES = (norm,)
KERNEL_OPSET = 17
_RNG = np.random.default_rng(7)


def _f(*shape: int, dtype: Any = np.float32, loc: float = 0.0) -> np.ndarray:
    return (_RNG.standard_normal(shape) + loc).astype(dtype)


def _ln(harness: Harness, inputs: list[Any], attrs: dict[str, Any], stash: int = 1) -> Any:
    attrs = {**attrs, "stash_type": stash}
    return harness.build("LayerNormalization", inputs, attrs, const=tuple(range(1, len(inputs))))


def _both(
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    inputs: list[Any],
    attrs: dict[str, Any],
    stash: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """(compiled path result, NumPy path result) of one node on ``inputs``."""
    monkeypatch.setenv(ENV_JIT, "1")
    fast = _ln(harness, inputs, attrs, stash)(*inputs)
    monkeypatch.setenv(ENV_JIT, "0")
    slow = _ln(harness, inputs, attrs, stash)(*inputs)
    monkeypatch.setenv(ENV_JIT, "1")
    return np.asarray(fast), np.asarray(slow)


@compiled_only
def test_kernel_is_compiled_for_float32_and_float64_only() -> None:
    assert layer_norm_rows(np.dtype(np.float32)) is not None
    assert layer_norm_rows(np.dtype(np.float64)) is not None
    assert layer_norm_rows(np.dtype(np.float16)) is None


@pytest.mark.parametrize("shape", [(1, 16, 128), (3, 197, 192), (5, 7), (2, 3, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_float32_rows_match_onnxruntime_and_numpy(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], bias: bool
) -> None:
    x = _f(*shape, loc=3.0)  # an offset mean: the one-pass variance must still be right
    params = [_f(shape[-1])] + ([_f(shape[-1])] if bias else [])
    attrs = {"epsilon": 1e-12}
    fast, slow = _both(harness, monkeypatch, [x, *params], attrs)
    (want,) = harness.ort("LayerNormalization", [x, *params], attrs)
    np.testing.assert_allclose(fast, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-5)


def test_float64_two_pass_keeps_precision_with_a_large_mean(
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = _f(4, 64, dtype=np.float64) * 1e-3 + 1e6  # var ~1e-6 under a mean of 1e6
    s, b = _f(64, dtype=np.float64), _f(64, dtype=np.float64)
    fast, slow = _both(harness, monkeypatch, [x, s, b], {"epsilon": 0.0}, stash=11)
    xc = x - x.mean(axis=-1, keepdims=True)
    want = xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True)) * s + b
    # a one-pass float64 variance (E[x^2] - mean^2) would be off by ~1e-4 here, not 1e-6
    np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)


def test_axis_over_several_trailing_dims_and_broadcast_parameters(
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = _f(2, 3, 4, 5)
    cases = (({"axis": 2}, (4, 5)), ({"axis": -1}, (1, 1, 5)), ({"axis": 1}, (3, 4, 5)))
    for attrs, s_shape in cases:
        s, b = _f(*s_shape), _f(*s_shape)
        fast, slow = _both(harness, monkeypatch, [x, s, b], attrs)
        (want,) = harness.ort("LayerNormalization", [x, s, b], attrs)
        assert fast.shape == x.shape
        np.testing.assert_allclose(fast, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-5)


def test_calls_the_kernel_does_not_fit_take_the_numpy_path(harness: Harness) -> None:
    x = _f(6, 8)
    s, b = _f(8), _f(8)
    fn = _ln(harness, [x, s, b], {})
    want = fn(x, s, b)
    # a strided input and a strided out
    xt = np.ascontiguousarray(x.T).T
    np.testing.assert_allclose(fn(xt, s, b), want, rtol=1e-5, atol=1e-6)
    big = np.empty((6, 16), np.float32)
    assert fn(x, s, b, out=big[:, ::2]) is not None
    np.testing.assert_allclose(big[:, ::2], want, rtol=1e-5, atol=1e-6)
    # parameters in another dtype than the stash type
    np.testing.assert_allclose(fn(x, s.astype(np.float64), b), want, rtol=1e-5, atol=1e-6)
    # out aliasing x (the compiled loop needs distinct buffers)
    x2 = x.copy()
    assert fn(x2, s, b, out=x2) is x2
    np.testing.assert_allclose(x2, want, rtol=1e-5, atol=1e-6)


@compiled_only
def test_a_strided_input_is_copied_once_and_takes_the_compiled_rows(
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MobileViT's unfolded patches reach LayerNorm as a transposed view: one copy, then
    the compiled rows (the NumPy path's passes over strided data took 5x the time); an
    ``out`` aliasing the view's base is still written correctly."""
    calls: list[int] = []
    real = norm.layer_norm_rows

    def spying(stash: Any) -> Any:
        fn = real(stash)

        def spy(*args: Any) -> None:
            calls.append(1)
            fn(*args)

        return spy

    monkeypatch.setattr(norm, "layer_norm_rows", spying)
    base = _f(4, 64, 256)
    x = base.transpose(0, 2, 1)  # (4, 256, 64), strided
    s, b = _f(64), _f(64)
    fn = _ln(harness, [x, s, b], {})
    want = harness.ort("LayerNormalization", [np.ascontiguousarray(x), s, b], {"stash_type": 1})[0]
    np.testing.assert_allclose(fn(x, s, b), want, rtol=1e-5, atol=1e-5)
    assert calls == [1]
    out = base.reshape(4, 256, 64)  # the view's own memory as the destination
    assert fn(x, s, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_one_kernel_called_with_other_parameters_and_ranks(harness: Harness) -> None:
    """The kernel remembers the last Scale/B it checked (a model passes the same
    constants every call); other arrays, an in-place change of the same ones, another
    rank and parameters that grow the result are each checked again."""
    x = _f(6, 8)
    s, b = _f(8), _f(8)
    fn = _ln(harness, [x, s, b], {})

    def ref(x: np.ndarray, s: np.ndarray, b: np.ndarray) -> np.ndarray:
        m = x.mean(axis=-1, keepdims=True)
        v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-5) * s + b

    for _ in range(2):
        np.testing.assert_allclose(fn(x, s, b), ref(x, s, b), rtol=1e-5, atol=1e-5)
    s2, b2 = _f(8), _f(8)
    np.testing.assert_allclose(fn(x, s2, b2), ref(x, s2, b2), rtol=1e-5, atol=1e-5)
    s2 *= 3  # the same objects, new values
    np.testing.assert_allclose(fn(x, s2, b2), ref(x, s2, b2), rtol=1e-5, atol=1e-5)
    x3 = _f(2, 3, 8)
    np.testing.assert_allclose(fn(x3, s2, b2), ref(x3, s2, b2), rtol=1e-5, atol=1e-5)
    s4 = _f(1, 1, 8)  # rank 3 parameters: fine for a rank-3 input ...
    np.testing.assert_allclose(fn(x3, s4, b2), ref(x3, s4, b2), rtol=1e-5, atol=1e-5)
    got = fn(x, s4, b2)  # ... for a rank-2 one they grow the result (NumPy path)
    assert got.shape == (1, 6, 8)
    np.testing.assert_allclose(got, ref(x, s4, b2), rtol=1e-5, atol=1e-5)


def test_nan_and_inf_rows_follow_the_numpy_path(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _f(4, 16)
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    s, b = _f(16), _f(16)
    with np.errstate(invalid="ignore"):  # the NumPy path warns on inf - inf
        fast, slow = _both(harness, monkeypatch, [x, s, b], {})
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(slow))
    ok = ~np.isnan(slow)
    np.testing.assert_allclose(fast[ok], slow[ok], rtol=1e-4, atol=1e-5)
    assert np.isnan(fast[1]).all() and np.isnan(fast[2]).any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_normalization_rows_match_onnxruntime_and_numpy(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, dtype: Any
) -> None:
    x = _f(2, 7, 48, dtype=dtype, loc=2.0)
    s = _f(48, dtype=dtype)
    stash = 1 if dtype == np.float32 else 11
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv(ENV_JIT, flag)
        attrs = {"epsilon": 1e-6, "stash_type": stash}
        fn = harness.build("RMSNormalization", [x, s], attrs, opset=23, const=(1,))
        outs.append(np.asarray(fn(x, s)))
    monkeypatch.setenv(ENV_JIT, "1")
    ms = (x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True)
    want = x / np.sqrt(ms + 1e-6) * s
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(outs[0], want, rtol=tol, atol=tol)
    np.testing.assert_allclose(outs[0], outs[1], rtol=tol, atol=tol)
    assert rms_norm_rows(np.dtype(dtype)) is not None


@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization"])
def test_the_compiled_rows_serve_the_common_calls(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """Scale only (no bias), contiguous float32, last axis: the compiled rows take it
    (a fit check that sends every call to NumPy would pass every agreement test)."""
    served = spy_served(monkeypatch, norm, "_compiled_rows")
    monkeypatch.setenv(ENV_JIT, "1")
    x, s = _f(3, 5, 32), _f(32)
    fn = harness.build(op, [x, s], {}, opset=23 if op == "RMSNormalization" else 17, const=(1,))
    fn(x, s)
    assert served == [True]
