"""A one-row product by a big matrix splits its columns over native threads only where
this host measured the split faster (``gemm.gemv_split_pays``): the split taken where it
pays, never where it does not, and the measurement made once per shape."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.jit_paths import spying_jitted
from tfrt_py.concurrency import native_threads
from tfrt_py.concurrency.threads import configure
from tfrt_py.kernels.lib import gemm

pytest.importorskip("numba", reason="native threads are numba's parallel loops")
pytestmark = pytest.mark.skipif(
    not native_threads.ready(),
    reason="numba's TBB threading layer is not available here (it needs a numba built with "
    "it, e.g. PyPI's wheels from 0.63 -- 0.62's have none -- and the tbb package: Linux x86-64)",
)


@pytest.fixture(autouse=True)
def two_threads() -> object:
    configure(2)
    yield
    configure(None)


@contextlib.contextmanager
def _gemv_split_decided(k: int, n: int, pays: bool) -> Iterator[None]:
    """The host's measured answer for a one-row product by a (k, n) float32 matrix on two
    threads set to ``pays`` (this host's own answer restored after)."""
    key = (k, n, 4, 2)
    before = gemm._GEMV_SPLIT_PAYS.get(key)
    gemm._GEMV_SPLIT_PAYS[key] = pays
    try:
        yield
    finally:
        if before is None:
            gemm._GEMV_SPLIT_PAYS.pop(key, None)
        else:
            gemm._GEMV_SPLIT_PAYS[key] = before


def test_one_row_by_a_big_matrix_splits_its_columns_where_it_pays() -> None:
    """A classifier's 1x1280 @ 1280x1000 (5 MB of weights) splits its columns over the
    threads, one BLAS gemv each, through ``matmul_into`` and a loaded Gemm alike (weights
    as (K, N) or, transB, (N, K)), on a host where the split was measured faster."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import tfrt_py

    rng = np.random.default_rng(4)
    a = rng.standard_normal((1, 1280)).astype(np.float32)
    w = rng.standard_normal((1280, 1000)).astype(np.float32)
    bias = rng.standard_normal(1000).astype(np.float32)
    with _gemv_split_decided(1280, 1000, True):
        assert gemm.wide_gemv(1, 1280, 1000, 4) and not gemm.wide_gemv(1, 128, 1000, 4)
        assert not gemm.wide_gemv(2, 1280, 1000, 4)  # gemm rows, not a gemv
        with spying_jitted(gemm._GEMV_COLS) as calls:
            got = gemm.matmul_into(a, w)
        assert calls == [1]
        np.testing.assert_allclose(got, a @ w, rtol=1e-4, atol=1e-3)
        for trans_b in (0, 1):  # torch.onnx writes a Linear as Gemm(transB=1) of (N, K)
            g = helper.make_graph(
                [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=trans_b),
                 helper.make_node("Relu", ["g"], ["y"])],
                "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1280])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                [numpy_helper.from_array(w.T.copy() if trans_b else w, "w"),
                 numpy_helper.from_array(bias, "b")],
            )  # fmt: skip
            model = tfrt_py.load(onnx.helper.make_model(g), executor="sync")
            with spying_jitted(gemm._GEMV_COLS) as calls:
                for _ in range(2):  # the probe, then the planned code
                    y = model.run({"x": a})["y"]
                    np.testing.assert_allclose(y, np.maximum(a @ w + bias, 0), rtol=1e-4, atol=1e-3)
            assert len(calls) == 2, trans_b


def test_a_gemv_split_measured_slower_stays_on_one_thread() -> None:
    """Where the split measured slower than one BLAS call (a parallel region's start
    costs more than the second thread saves: the 2-core hosts), the product stays whole,
    in ``matmul_into`` and in a loaded model's planned code."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import tfrt_py

    rng = np.random.default_rng(5)
    a = rng.standard_normal((1, 1024)).astype(np.float32)
    w = rng.standard_normal((1024, 256)).astype(np.float32)
    with _gemv_split_decided(1024, 256, False):
        assert not gemm.wide_gemv(1, 1024, 256, 4)
        with spying_jitted(gemm._GEMV_COLS) as calls:
            got = gemm.matmul_into(a, w)
        assert calls == []
        np.testing.assert_allclose(got, a @ w, rtol=1e-4, atol=1e-3)
        g = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1024])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(w, "w")],
        )  # fmt: skip
        model = tfrt_py.load(onnx.helper.make_model(g), executor="sync")
        with spying_jitted(gemm._GEMV_COLS) as calls:
            for _ in range(3):
                y = model.run({"x": a})["y"]
                np.testing.assert_allclose(y, a @ w, rtol=1e-4, atol=1e-3)
        assert calls == []


def test_the_gemv_split_is_measured_once_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first question about a shape measures both ways on this host and remembers the
    answer; later questions (every call of a plan) do not measure again."""
    key = (1536, 384, 4, 2)
    gemm._GEMV_SPLIT_PAYS.pop(key, None)
    measured: list[tuple[int, ...]] = []
    real = gemm._measure_gemv_split

    def counting(*args: int) -> bool:
        measured.append(args)
        return real(*args)

    monkeypatch.setattr(gemm, "_measure_gemv_split", counting)
    first = gemm.gemv_split_pays(1536, 384, 4, 2)
    assert measured == [(1536, 384, 4, 2)] and gemm._GEMV_SPLIT_PAYS[key] is first
    for _ in range(3):
        assert gemm.wide_gemv(1, 1536, 384, 4) is first
    assert len(measured) == 1
    assert not gemm.gemv_split_pays(1536, 384, 4, 1)  # one thread: nothing to split over
    gemm._GEMV_SPLIT_PAYS.pop(key, None)


def test_read_only_operands_compile_nothing_new() -> None:
    """A model's constant weights are read-only arrays, the host's probe passes writable
    ones, and numba compiles per argument types: ``gemv_cols`` passes its operands read-only
    either way, so after its warm-up no call compiles (a model's first split call used to)."""
    fn = gemm._GEMV_COLS.get()
    assert fn is not None
    a = np.random.default_rng(2).standard_normal((1, 512)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal((512, 1024)).astype(np.float32)
    before = len(fn.overloads)
    for wv in (w, w.copy(), np.ascontiguousarray(w.T).T):  # writable, and (N, K) transposed
        for ro in (False, True):
            x, m = a.copy(), wv.copy(order="K") if ro else wv
            if ro:
                x.flags.writeable = m.flags.writeable = False
            out = np.empty((1, 1024), np.float32)
            assert gemm.gemv_cols(x, m, out, 2)
            np.testing.assert_allclose(out, a @ w, rtol=1e-4, atol=1e-4)
    assert len(fn.overloads) == before
