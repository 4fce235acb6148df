"""Reduce-family kernels (Reduce*, ArgMax/ArgMin, TopK, CumSum, Softmax family, losses)
against onnxruntime on one-node models, plus edge cases the ONNX node cases miss."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.support.jit_paths import spy_compiled
from tests.support.kernel_harness import Harness
from tfrt_py.kernels import reduce

KERNEL_FAMILIES = (reduce,)
KERNEL_TOL = 1e-5
_RNG = np.random.default_rng(0)


_REDUCE = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]


@pytest.mark.parametrize("op", [*_REDUCE, "ReduceLogSum"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reduce_matches_ort_attr_and_input_axes(harness: Harness, op: str, dtype: type) -> None:
    if dtype is np.int32 and op in ("ReduceLogSum", "ReduceLogSumExp"):
        pytest.skip("float-only op")
    x = _RNG.standard_normal((3, 4, 5)) * 2
    x = (np.abs(x) + 0.5 if op == "ReduceLogSum" else x).astype(dtype)
    for keepdims in (0, 1):
        harness.check(op, [x], {"axes": [0, 2], "keepdims": keepdims}, opset=11)
        harness.check(op, [x], {"keepdims": keepdims}, opset=11)
        harness.check(op, [x, np.array([-1], np.int64)], {"keepdims": keepdims}, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_reduce_trailing_blas_path(harness: Harness, op: str) -> None:
    x = _RNG.standard_normal((3, 40, 60)).astype(np.float32)
    for axes in ([-1], [1, 2], [2]):
        harness.check(op, [x, np.array(axes, np.int64)], {"keepdims": 1}, opset=18, tol=1e-4)
        harness.check(op, [x, np.array(axes, np.int64)], {"keepdims": 0}, opset=18, tol=1e-4)
    fn = harness.build(op, [x, np.array([-1], np.int64)], {}, opset=18, const=(1,))
    out = np.empty((3, 40, 1), np.float32)
    assert fn(x, None, out=out) is out
    want = x.sum(-1, keepdims=True) / (60 if op == "ReduceMean" else 1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_reduce_empty_set_identities_without_warnings(harness: Harness) -> None:
    x = np.zeros((2, 0, 3), np.float32)
    axes = np.array([1], np.int64)
    expect = {
        "ReduceSum": 0.0,
        "ReduceProd": 1.0,
        "ReduceMax": -np.inf,
        "ReduceMin": np.inf,
        "ReduceLogSum": -np.inf,
        "ReduceLogSumExp": -np.inf,
        "ReduceL2": 0.0,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for op, v in expect.items():
            y = harness.build(op, [x, axes], {"keepdims": 1}, opset=18, const=(1,))(x, axes)
            assert y.shape == (2, 1, 3) and y.dtype == np.float32
            assert np.all(y == v), op
    xi = np.zeros((0, 2), np.int32)
    y = harness.build("ReduceMax", [xi, np.array([0])], {"keepdims": 0}, opset=18)(
        xi, np.array([0])
    )
    assert y.dtype == np.int32 and np.all(y == np.iinfo(np.int32).min)


def test_reduce_noop_and_dynamic_axes(harness: Harness) -> None:
    x = _RNG.standard_normal((2, 3)).astype(np.float32)
    empty = np.array([], np.int64)
    fn = harness.build("ReduceSum", [x, empty], {"noop_with_empty_axes": 1}, opset=13)
    assert np.array_equal(fn(x, empty), x)
    assert np.array_equal(fn(x, np.array([1])), x.sum(1, keepdims=True))
    fn = harness.build("ReduceSum", [x, None], {"keepdims": 0}, opset=13)
    assert np.allclose(fn(x, None), x.sum())


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_ties_and_select_last_index(harness: Harness, op: str) -> None:
    x = _RNG.integers(0, 3, (4, 5, 6)).astype(np.float32)
    for axis in (0, -1):
        for last in (0, 1):
            harness.check(
                op, [x], {"axis": axis, "keepdims": 0, "select_last_index": last}, opset=13
            )


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int64])
def test_topk_ties_keep_lower_index_first(harness: Harness, dtype: type, jit: str) -> None:
    x: np.ndarray = _RNG.integers(0, 4, (3, 9)).astype(dtype)
    k = np.array([4], np.int64)
    for largest in (0, 1):
        for axis in (0, 1):
            kk = np.array([2], np.int64) if axis == 0 else k
            harness.check("TopK", [x, kk], {"axis": axis, "largest": largest}, opset=11, n_out=2)
    fn = harness.build("TopK", [x], {"k": 2, "axis": -1}, opset=1, n_out=2)
    vals, idx = fn(x)
    assert idx.dtype == np.int64 and vals.shape == (3, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int8, np.uint8])
def test_topk_small_k_of_a_long_axis_with_ties_matches_onnxruntime(
    harness: Harness, dtype: type, jit: str
) -> None:
    """k a small fraction of a long axis (the partition path): ties -- many, with integer
    keys -- come out by ascending index, exactly as onnxruntime orders them; a NaN in a
    float input takes the sorting path."""
    rng = np.random.default_rng(7)
    x: np.ndarray
    if np.dtype(dtype).kind == "f":
        x = (rng.integers(-20, 20, (60, 300)) / 4).astype(dtype)  # many exact ties
    else:
        lo = 0 if np.dtype(dtype).kind == "u" else int(np.iinfo(dtype).min)
        x = rng.integers(lo, lo + 30, (60, 300)).astype(dtype)  # ties, and the minimum
    for largest in (0, 1):
        for axis, k in ((1, 5), (0, 1), (0, 15), (-1, 70)):
            kk = np.array([k], np.int64)
            harness.check("TopK", [x, kk], {"axis": axis, "largest": largest}, opset=11, n_out=2)
    if np.dtype(dtype).kind == "f":
        x[2, 17] = np.nan
        harness.check("TopK", [x, np.array([5], np.int64)], {"largest": 0}, opset=11, n_out=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_small_k_takes_the_compiled_rows(
    harness: Harness, dtype: type, jit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nearest-neighbour TopK (k of a few hundred distances per query) runs on the
    compiled rows, ties and infinities included, in onnxruntime's order; a row with a NaN
    goes back to the NumPy path."""
    from tfrt_py.kernels.reduce import index

    calls = spy_compiled(monkeypatch, index, "topk_rows")
    rng = np.random.default_rng(8)
    x: np.ndarray = (rng.integers(-20, 20, (30, 200)) / 4).astype(dtype)
    x[3, 7], x[4, 9], x[5, 11] = np.inf, -np.inf, -0.0
    for largest in (0, 1):
        for k in (1, 5, 32):
            kk = np.array([k], np.int64)
            harness.check("TopK", [x, kk], {"largest": largest}, opset=11, n_out=2)
    assert (calls and all(calls)) if jit == "jit" else not calls
    x[2, 17] = np.nan
    calls.clear()
    harness.check("TopK", [x, np.array([5], np.int64)], {"largest": 0}, opset=11, n_out=2)
    assert (calls and not any(calls)) if jit == "jit" else not calls


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_cumsum_exclusive_reverse(harness: Harness, dtype: type) -> None:
    x: np.ndarray = (_RNG.standard_normal((3, 5)) * 4).astype(dtype)
    for ex in (0, 1):
        for rev in (0, 1):
            for axis in (0, -1):
                a = {"exclusive": ex, "reverse": rev}
                harness.check("CumSum", [x, np.array(axis, np.int32)], a, opset=14)


def _softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_fast_path_and_fallbacks(harness: Harness) -> None:
    x = _RNG.standard_normal((2, 16, 40)).astype(np.float32) * 3
    x[0, 3] -= 500.0  # a row far below the global max: forces the per-row fallback
    soft = harness.build("Softmax", [x], {}, opset=13)
    logsoft = harness.build("LogSoftmax", [x], {}, opset=13)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for v in (x, x + 200.0, x[:, :, ::2], np.ascontiguousarray(x[1:])):
            np.testing.assert_allclose(soft(v), _softmax64(v, -1), rtol=1e-5, atol=1e-7)
            want = np.log(_softmax64(v, -1))
            np.testing.assert_allclose(logsoft(v), want, rtol=1e-5, atol=1e-5)
    masked = x.copy()
    masked[:, :, :10] = -np.inf
    np.testing.assert_allclose(soft(masked), _softmax64(masked, -1), rtol=1e-5, atol=1e-7)
    out = np.empty_like(x)
    assert soft(x, out=out) is out
    np.testing.assert_allclose(out, _softmax64(x, -1), rtol=1e-5, atol=1e-7)
    inplace = x.copy()
    logsoft(inplace, out=inplace)  # LogSoftmax is registered inplace
    np.testing.assert_allclose(inplace, np.log(_softmax64(x, -1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family_opset_semantics(harness: Harness, op: str) -> None:
    x = _RNG.integers(-3, 3, (3, 4, 5)).astype(np.float32)
    for opset in (11, 13):
        for axis in (0, 1, -1):
            harness.check(op, [x], {"axis": axis}, opset=opset)
    big = _RNG.standard_normal((32, 6, 7)).astype(np.float32)
    harness.check(op, [big], {"axis": 1}, opset=11)


def test_losses_match_ort(harness: Harness) -> None:
    x = _RNG.standard_normal((4, 5, 3)).astype(np.float32)
    t = _RNG.integers(0, 5, (4, 3)).astype(np.int64)
    t[0, 0] = 2
    w = _RNG.random(5).astype(np.float32)
    for red in ("none", "sum", "mean"):
        a = {"reduction": red, "ignore_index": 2}
        harness.check("SoftmaxCrossEntropyLoss", [x, t, w], a, opset=13, n_out=2)
        harness.check("SoftmaxCrossEntropyLoss", [x, t], {"reduction": red}, opset=13)
        harness.check("NegativeLogLikelihoodLoss", [x, t, w], a, opset=13)
        harness.check("NegativeLogLikelihoodLoss", [x, t], {"reduction": red}, opset=13)
