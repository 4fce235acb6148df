"""A float32 Linear's packed product (``kernels/lib/linear_par.Serial``): every width gets
one (the columns past the last whole panel padded at load, computed in a scratch and
copied), and a product of a few rows by a weight big enough splits by columns over the
native threads (``Serial.split``) -- a decode step's projections. Both compute what NumPy
computes, from the kernel and from the sync interpreter's generated code, at fixed and at
changing shapes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.concurrency import native_threads
from tfrt_py.concurrency.threads import configure
from tfrt_py.kernels.lib import linear_par
from tfrt_py.kernels.lib.jit import jit_enabled

pytestmark = pytest.mark.skipif(not jit_enabled(), reason="numba is not installed")


def _packed_here() -> bool:
    return linear_par.serial_for([], None, np.ones((4, 32), np.float32)) is not None


def _want(a: np.ndarray, w: np.ndarray, b: np.ndarray | None, relu: bool) -> np.ndarray:
    y = a.astype(np.float64) @ w.astype(np.float64)
    if b is not None:
        y += b
    return np.maximum(y, 0.0) if relu else y


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The process's budget at two threads for the test (the split needs two)."""
    configure(2)
    yield
    configure()


@pytest.mark.parametrize("width", [(1, 0), (1, 1), (1, 7), (2, -1), (3, 5), (0, 688), (0, 1000)])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_every_width_gets_a_packed_product(width: tuple[int, int], rows: int) -> None:
    """Widths that are not a multiple of the panel width (the tiny model zoo's 688-wide MLP,
    a 1000-token head) were left to NumPy's gemm; now they are packed with zero columns
    up to a whole panel, and the product matches NumPy's, bias and ReLU included, with
    nothing written past the output's columns. Narrower than one panel: NumPy's gemm."""
    if not _packed_here():
        pytest.skip("no packed kernel here (numba missing, or a CPU without AVX2 and FMA)")
    nr = linear_par._panel_width()
    n = width[0] * nr + width[1]
    assert linear_par.serial_for([], None, np.ones((8, nr - 1), np.float32)) is None
    rng = np.random.default_rng(n * 31 + rows)
    k = 64 if n < 1000 else 256
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    relu: list[tuple[str, int, dict[str, Any], tuple[int, ...]]] = [("Relu", 0, {}, (-1,))]
    for bias, steps in ((b, relu), (None, [])):
        sr = linear_par.serial_for(steps, bias, w)
        assert sr is not None and sr.n == n
        a = rng.standard_normal((rows, k)).astype(np.float32)
        buf = np.full(rows * n + 40, 7.0, np.float32)  # guard values after the output
        got = buf[: rows * n].reshape(rows, n)
        assert sr.run(a, got)
        np.testing.assert_allclose(got, _want(a, w, bias, bool(steps)), rtol=2e-5, atol=2e-4)
        assert (buf[rows * n :] == 7.0).all()
        if rows > 1:
            wide = np.full((rows, n + 40), 7.0, np.float32)
            assert not sr.run(a, wide[:, :n])  # a strided output is refused, untouched
            assert (wide == 7.0).all()


@pytest.mark.parametrize("n", [256, 688, 700])
def test_a_few_rows_split_by_columns_compute_the_same(n: int, two_threads: None) -> None:
    """One to four rows by a weight of at least ``COLS_MIN_BYTES`` split into column blocks
    on the native threads, up to ``COLS_MAX_ROWS`` from ``NATIVE_SPLIT_MIN_MACS``: the
    values of the one-thread product, a part's last panel padded included; five rows
    (too small a product), 65, or a budget of one thread, are declined (nothing done)."""
    if not _packed_here() or not native_threads.ready() or native_threads.max_threads() < 2:
        pytest.skip("needs the packed kernel and two native threads")
    rng = np.random.default_rng(n)
    w = rng.standard_normal((256, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    sr = linear_par.serial_for([("Relu", 0, {}, (-1,))], b, w)
    assert sr is not None and sr.cols is not None
    for rows in (1, 2, 4):
        a = rng.standard_normal((rows, 256)).astype(np.float32)
        split, one = np.zeros((rows, n), np.float32), np.zeros((rows, n), np.float32)
        assert sr.split(a, split)
        assert sr.run(a, one)
        np.testing.assert_allclose(split, one, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(split, _want(a, w, b, True), rtol=2e-5, atol=2e-4)
    five = rng.standard_normal((5, 256)).astype(np.float32)  # under NATIVE_SPLIT_MIN_MACS
    assert not sr.split(five, np.zeros((5, n), np.float32))
    many = rng.standard_normal((40, 256)).astype(np.float32)
    split, one = np.zeros((40, n), np.float32), np.zeros((40, n), np.float32)
    assert sr.split(many, split) and sr.run(many, one)
    np.testing.assert_allclose(split, one, rtol=1e-6, atol=1e-6)
    assert not sr.split(np.zeros((65, 256), np.float32), np.zeros((65, n), np.float32))
    configure(1)
    assert not sr.split(five[:1], np.zeros((1, n), np.float32))
    small = linear_par.serial_for([], None, w[:, :64])
    assert small is not None and small.cols is None  # 64 KB: a split would cost more


def _linear_model(n: int, rows: int | str) -> bytes:
    rng = np.random.default_rng(5)
    w = rng.standard_normal((256, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("rows", [1, "seq"])
def test_the_plans_code_splits_one_row_products(
    rows: int | str, two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode step's Linear (one row of a (1, seq, 256) input, 688 columns) runs split by
    columns from the generated code of a fixed plan and of the generic plan, and longer
    inputs take the one-thread or row-split paths: every answer is the unfused graph's."""
    if not _packed_here() or not native_threads.ready() or native_threads.max_threads() < 2:
        pytest.skip("needs the packed kernel and two native threads")
    real = linear_par._LINEAR_COLS.get()
    assert real is not None
    ran: list[int] = []

    def spy(a: np.ndarray, *rest: object) -> None:
        real(a, *rest)
        ran.append(a.shape[0])

    monkeypatch.setattr(linear_par._LINEAR_COLS, "get", lambda: spy)
    data = _linear_model(688, rows)
    fused = tfrt_py.load(data, executor="sync")
    plain = tfrt_py.load(data, executor="sync", optimize=False)
    assert any(n.op_type == "Linear" for n in fused.prepared.graph.nodes)
    lengths = [1, 1, 1] if rows == 1 else [1, 1, 3, 7, 40, 1, 2]
    for seq in lengths:
        x = np.random.default_rng(seq).standard_normal((1, seq, 256)).astype(np.float32)
        ran.clear()
        got, want = fused.run({"x": x})["y"], plain.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
        assert ran == ([seq] if seq <= linear_par.COLS_MAX_ROWS else [])


def _head_model(k: int, n: int, rows: int | str, trans_b: bool) -> bytes:
    """A classifier's head: Gemm (transB as torch exports it, or a MatMul's [K, N]) + bias."""
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32) * 0.05
    b = rng.standard_normal(n).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1 if trans_b else 0)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _spied(monkeypatch: pytest.MonkeyPatch, jitted: Any, ran: list[tuple[str, int]],
           name: str) -> None:  # fmt: skip
    """``jitted.get()`` gives a wrapper that records (``name``, rows) of each call."""
    real = jitted.get()
    assert real is not None

    def spy(a: np.ndarray, *rest: object) -> None:
        real(a, *rest)
        ran.append((name, a.shape[0]))

    monkeypatch.setattr(jitted, "get", lambda: spy)


@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize("executor", ["sync", "async"])
def test_a_big_weight_is_packed_on_its_first_product_of_two_rows(
    trans_b: bool, executor: str, two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A classifier's 1024x1000 head (4 MB, over ``PACK_MAX_BYTES``) on a dynamic batch:
    one-row calls leave it unpacked (NumPy's gemv, no second copy); the first batch of 8
    packs it, and from then on a few rows split by columns and many by rows over the
    native threads on the packed weight, one row still NumPy's -- every answer the unfused
    graph's. (Before, batch 8 ran NumPy's gemm on one thread, on OpenBLAS's slow path for
    a transposed weight.)"""
    if not _packed_here() or not native_threads.ready() or native_threads.max_threads() < 2:
        pytest.skip("needs the packed kernel and two native threads")
    assert linear_par.PACK_MAX_BYTES < 1024 * 1000 * 4
    ran: list[tuple[str, int]] = []
    _spied(monkeypatch, linear_par._LINEAR_COLS, ran, "cols")
    _spied(monkeypatch, linear_par._LINEAR_ROWS, ran, "rows")
    _spied(monkeypatch, linear_par._LINEAR_SERIAL, ran, "one")
    packs: list[int] = []
    real_pack = linear_par.pack_padded

    def pack(w: np.ndarray) -> np.ndarray:
        packs.append(w.shape[1])
        return real_pack(w)

    monkeypatch.setattr(linear_par, "pack_padded", pack)
    data = _head_model(1024, 1000, "n", trans_b)
    fused = tfrt_py.load(data, executor=executor)
    plain = tfrt_py.load(data, executor=executor, optimize=False)
    want_paths = {1: [], 8: [("cols", 8)], 128: [("rows", 128)]}
    for rows, packed in ((1, 0), (1, 0), (8, 1), (8, 1), (1, 1), (128, 1)):
        x = np.random.default_rng(rows).standard_normal((rows, 1024)).astype(np.float32)
        ran.clear()
        got, want = fused.run({"x": x})["y"], plain.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        assert len(packs) == packed
        assert ran == want_paths[rows]


def test_rows_known_at_load_pack_a_big_weight_at_load(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A static batch of 16 by a 4 MB head packs at load and splits by columns on its first
    call (past ``STREAM_ROWS``: the product is over ``NATIVE_SPLIT_MIN_MACS``); a static
    batch of 1 never packs it."""
    if not _packed_here() or not native_threads.ready() or native_threads.max_threads() < 2:
        pytest.skip("needs the packed kernel and two native threads")
    ran: list[tuple[str, int]] = []
    _spied(monkeypatch, linear_par._LINEAR_COLS, ran, "cols")
    _spied(monkeypatch, linear_par._LINEAR_SERIAL, ran, "one")
    made: list[int] = []
    real_pack = linear_par.pack_padded

    def pack(w: np.ndarray) -> np.ndarray:
        made.append(w.shape[1])
        return real_pack(w)

    monkeypatch.setattr(linear_par, "pack_padded", pack)
    for rows, paths in ((16, [("cols", 16)]), (1, [])):
        made.clear()
        data = _head_model(1024, 1000, rows, True)
        fused = tfrt_py.load(data, executor="sync")
        assert made == ([1000] if rows > 1 else [])
        plain = tfrt_py.load(data, executor="sync", optimize=False)
        x = np.random.default_rng(rows).standard_normal((rows, 1024)).astype(np.float32)
        for _ in range(2):  # the probe, then the plan's code
            ran.clear()
            got = fused.run({"x": x})["y"]
            np.testing.assert_allclose(got, plain.run({"x": x})["y"], rtol=2e-5, atol=2e-5)
            assert ran == paths
