"""Rows mode's tile body (``native.lower.TILE_ROWS`` rows at once, big products on NumPy's
gemm; the rest of a batch row by row), and the vectorizable float32 ``expf`` its Softmax
uses (``native.kern_math``)."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tfrt_py.ir import Graph, GraphBuilder
from tfrt_py.kernels.lib import blas

lower_mod = importlib.import_module("tfrt_py.native.lower.graph")  # the package exports lower()

pytest.importorskip("numba", reason="the native tier needs numba")

RNG = np.random.default_rng(64)
T = lower_mod.TILE_ROWS


def _mlp(dtype: Any = np.float32) -> Graph:
    """MatMul+Add+Relu, a Gemm with transB (its weight packed transposed; 160 terms into 40
    columns, a product that stays on NumPy's gemm: ``products.CHAIN_K``), a small MatMul
    (N=4) into Softmax; the hidden layer is an output too."""
    b = GraphBuilder("tiles")
    x = b.input("x", dtype, ("N", 32))
    w0 = b.const((RNG.standard_normal((32, 160)) / 6).astype(dtype))
    h = b.op(
        "Relu", b.op("Add", b.op("MatMul", x, w0), b.const(RNG.standard_normal(160).astype(dtype)))
    )
    w1 = b.const((RNG.standard_normal((40, 160)) / 12).astype(dtype))
    g = b.op("Gemm", h, w1, b.const(RNG.standard_normal(40).astype(dtype)), transB=1)
    w2 = b.const((RNG.standard_normal((40, 4)) / 7).astype(dtype))
    b.output(b.op("Softmax", b.op("MatMul", g, w2), axis=-1), "p")
    b.output(h, "h")
    return b.build()


def _agree(native: tfrt_py.Model, sync: tfrt_py.Model, x: np.ndarray) -> None:
    got, want = native.run({"x": x}), sync.run({"x": x})
    for k in want:
        assert got[k].shape == want[k].shape
        np.testing.assert_allclose(got[k], want[k], rtol=3e-5, atol=1e-6, err_msg=k)


needs_blas = pytest.mark.skipif(
    not blas.available(), reason="NumPy's BLAS exports no gemm numba can call here"
)


@needs_blas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.compiles
def test_whole_tiles_use_gemm_and_the_rest_runs_row_by_row(dtype: Any) -> None:
    g = _mlp(dtype)
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert native.native.form == "rows"
    source = native.native.lowered.source
    assert f"gemm_{'f4' if dtype == np.float32 else 'f8'}(" in source
    assert f"for tw in range(lo, tiled, {T}):" in source
    for n in (0, 1, T - 1, T, T + 1, 2 * T + 3, 300):
        _agree(native, sync, RNG.standard_normal((n, 32)).astype(dtype))


@needs_blas
def test_split_rows_need_not_start_on_a_tile() -> None:
    """Threads call ``run_into`` on row ranges: a range that starts and ends mid-tile
    fills exactly those rows, each as the interpreter computes it."""
    g = _mlp()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    x = RNG.standard_normal((3 * T + 5, 32)).astype(np.float32)
    want = sync.run({"x": x})
    compiled, lowered = native.native.compiled, native.native.lowered
    names = lowered.output_names
    outs = [np.full((len(x), *want[k].shape[1:]), -7.0, np.float32) for k in names]
    lo, hi = 5, 2 * T + 9
    compiled.fn_into(x, *outs, *lowered.params, lo, hi)
    for k, out in zip(names, outs):
        np.testing.assert_allclose(out[lo:hi], want[k][lo:hi], rtol=3e-5, atol=1e-6)
        assert (out[:lo] == -7.0).all() and (out[hi:] == -7.0).all()


@needs_blas
def test_the_tile_body_packs_no_constant_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tile body reuses the row body's packed weights (the Gemm's transposed copy
    too): the tiled module's parameters are no bigger than the row-only module's."""
    g = _mlp()
    tiled = tfrt_py.load(g, executor="native", native="eager").native.lowered
    monkeypatch.setattr(lower_mod.blas, "available", lambda: False)
    plain = tfrt_py.load(g, executor="native", native="eager").native.lowered
    assert "gemm_f4(" in tiled.source and "gemm_f4(" not in plain.source
    assert [p.size for p in tiled.params] == [p.size for p in plain.params]


@needs_blas
def test_over_budget_with_tiles_keeps_rows_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _mlp()
    tiled = tfrt_py.load(g, executor="native", native="eager").native.lowered
    monkeypatch.setattr(lower_mod.blas, "available", lambda: False)
    plain_units = tfrt_py.load(g, executor="native", native="eager").native.lowered.units
    monkeypatch.undo()
    assert plain_units < tiled.units
    monkeypatch.setenv("TFRT_PY_NATIVE_BUDGET", str(plain_units))
    native = tfrt_py.load(g, executor="native", native="eager")
    assert native.native.form == "rows"
    assert "gemm_f4(" not in native.native.lowered.source
    _agree(
        native, tfrt_py.load(g, executor="sync"), RNG.standard_normal((150, 32)).astype(np.float32)
    )


def _naive_bayes() -> Graph:
    """A ComplementNB's math: scores = x W (10 features, 3 classes), log-probabilities
    scores - ReduceLogSumExp(scores), their Exp, and the label (ArgMax)."""
    b = GraphBuilder("nb")
    x = b.input("x", np.float32, ("N", 10))
    s = b.op("MatMul", x, b.const(RNG.standard_normal((10, 3)).astype(np.float32)))
    lse = b.op("ReduceLogSumExp", s, axes=[1], keepdims=1)
    b.output(b.op("Exp", b.op("Sub", s, lse)), "p")
    b.output(b.op("ArgMax", s, axis=1, keepdims=0), "label")
    return b.build()


@pytest.mark.compiles
def test_a_small_graph_with_exp_gets_a_tile_of_the_rows_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exp and ReduceLogSumExp vectorize only across rows (a row has 3 classes): a small
    graph with them gets a tile body (``graph.VECTOR_MATH_NODES``), whose outputs are the
    row body's bit for bit; a graph over the limit keeps rows one at a time."""
    g = _naive_bayes()
    tiled = tfrt_py.load(g, executor="native", native="eager")
    assert tiled.native.form == "rows"
    assert f"for tw in range(lo, tiled, {T}):" in tiled.native.lowered.source
    assert "tiles of 64 rows" in tiled.describe()
    monkeypatch.setattr(lower_mod, "VECTOR_MATH_NODES", 0)
    rows = tfrt_py.load(g, executor="native", native="eager")
    assert "for tw in range" not in rows.native.lowered.source
    for n in (1, T - 1, T, T + 1, 2 * T + 3):
        x = (RNG.standard_normal((n, 10)) * 3).astype(np.float32)
        got, want = tiled.run({"x": x}), rows.run({"x": x})
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k} at {n} rows")


_EDGES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72283, 88.7229, 89.0, -87.3, -87.33, -87.34,
          -103.2, -103.9, -104.0, -1000.0, 1e-8, -1e-8]  # fmt: skip


def _apply(name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the float32 arguments: ``x`` and the edges; ``fastmath.<name>`` of them; float64's
    exp of them rounded to float32)."""
    from numba import njit

    from tfrt_py.native.kernels import fastmath

    fn = getattr(fastmath, name)

    @njit
    def apply(x: np.ndarray, y: np.ndarray) -> None:
        for i in range(x.size):
            y[i] = fn(x[i])

    x = np.concatenate([x, _EDGES]).astype(np.float32)
    if name == "expf_neg":
        x = x[~(x > 0)]
    y = np.empty_like(x)
    apply(x, y)
    with np.errstate(over="ignore", under="ignore"):
        return x, y, np.exp(x.astype(np.float64)).astype(np.float32)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32))


def test_expf_is_within_one_ulp_of_float64_exp_and_keeps_the_edges() -> None:
    x, y, want = _apply("expf", np.linspace(-110, 90, 400_001))
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all()
    finite = np.isfinite(want) & ~nan
    assert _ulps(y[finite], want[finite]).max() <= 1
    assert (y[~finite & ~nan] == np.inf).all()  # overflow, +inf
    assert (y[x < -103.98] == 0.0).all()  # below the smallest subnormal, -inf included


def test_expf_rn_is_the_correctly_rounded_expf() -> None:
    """``expf_rn`` (onnxruntime's SVM kernels call libm's ``expf``): float64's exp rounded
    once to float32, the same bits on every float32 argument tried, edges included."""
    rng = np.random.default_rng(3)
    x, y, want = _apply(
        "expf_rn", np.concatenate([np.linspace(-110, 90, 400_001), rng.uniform(-30, 10, 400_000)])
    )
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all()
    np.testing.assert_array_equal(y[~nan], want[~nan])


def test_tanhf_mlas_is_the_interpreters_mlas_tanh() -> None:
    """``tanhf_mlas`` (fused multiply-adds) and the interpreter's NumPy form of MLAS's tanh
    (``kernels.lib.mlas_tanh.tanh_mlas``: float64 sums rounded once) agree bit for bit, clamp at
    +-9 (tanh(9) within 1 ulp of 1), keep NaN, and stay within 3e-7 of tanh."""
    from tfrt_py.kernels.lib.mlas_tanh import tanh_mlas

    rng = np.random.default_rng(4)
    x, y, _ = _apply("tanhf_mlas", np.concatenate([np.linspace(-12, 12, 200_001),
                                                   rng.standard_normal(200_000) * 3]))  # fmt: skip
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all()
    np.testing.assert_array_equal(y[~nan], tanh_mlas(x[~nan]))
    assert (np.abs(y[np.abs(x) >= 9] - np.sign(x[np.abs(x) >= 9])) <= 1.2e-7).all()
    ok = ~nan & np.isfinite(x)
    np.testing.assert_allclose(y[ok], np.tanh(x[ok].astype(np.float64)), rtol=0, atol=3e-7)


def test_expf_neg_is_expf_where_a_softmax_calls_it() -> None:
    """``expf_neg`` (a softmax's x - max <= 0): within one ulp of float64's exp down to the
    smallest normal float's log, 0 below it and at -inf, NaN kept."""
    x, y, want = _apply("expf_neg", np.linspace(-100, 0, 400_001))
    assert np.isnan(y[np.isnan(x)]).all()
    normal = x >= np.float32(-87.33654)
    assert _ulps(y[normal], want[normal]).max() <= 1
    assert (y[x < np.float32(-87.33654)] == 0.0).all()  # -inf included


def test_float32_softmax_edges_agree_with_the_interpreter() -> None:
    """The native Softmax (shift, vectorized exponentials, scale) on rows with -inf,
    huge, tiny and NaN values."""
    b = GraphBuilder("sm")
    x = b.input("x", np.float32, ("N", 5))
    b.output(b.op("Softmax", x, axis=-1), "y")
    g = b.build()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert "expf_neg(" in native.native.lowered.source
    rows = np.array(
        [[0, 1, 2, 3, 4], [-np.inf, 0, 0, -np.inf, 1], [1e30, 0, -1e30, 5, 5],
         [-200, -150, -100, -50, 0], [np.nan, 1, 2, 3, 4], [3e38, 3e38, 0, 0, 0]],
        np.float32,
    )  # fmt: skip
    with np.errstate(all="ignore"):
        got, want = native.run({"x": rows})["y"], sync.run({"x": rows})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, equal_nan=True)


@needs_blas
def test_a_module_calling_gemm_or_expf_states_the_kernels_version() -> None:
    """numba's cache of a generated module holds the machine code of what it calls (gemm,
    the inlined expf): the module states the kernels' version, so a changed kernel file
    changes the module's source and its cache key."""
    from tfrt_py.native.lower.ops_ml import kernel_version
    from tfrt_py.native.lower.source import literal

    source = tfrt_py.load(_mlp(), executor="native", native="eager").native.lowered.source
    assert "gemm_f4(" in source and "expf_neg(" in source
    assert f"KV = {literal(kernel_version())}" in source
