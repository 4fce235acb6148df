"""A one-row product by a big transposed weight -- a classifier's head, which torch.onnx
writes as Gemm(transB=1) of an (N, K) matrix -- takes ``gemm.gemv_dots`` (one dot product
a row of the (N, K) matrix, each row read once) on the calling thread: through
``matmul_into`` and a loaded model's planned code, never for another layout, a small
weight or more rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.spies import record_calls
from tfrt_py.concurrency.threads import configure
from tfrt_py.kernels.lib import gemm

pytestmark = pytest.mark.skipif(
    gemm._GEMV_DOTS.get() is None, reason="numba kernels off (the NumPy path keeps BLAS)"
)

_RNG = np.random.default_rng(17)


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    configure(1)
    yield
    configure(None)


@pytest.fixture
def dots_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a host where the dot products beat BLAS's gemv (Zen 4; on Zen 3 they lose)."""
    monkeypatch.setattr(gemm, "gemv_dots_pays", lambda k, n, itemsize: True)


def _taken(weights: list[np.ndarray]) -> list[tuple[int, ...]]:
    """The shapes of the weights ``gemm.gemv_dots`` was called with that it takes (the
    transpose of a C-contiguous matrix); the calls it refuses left out."""
    return [b.shape for b in weights if not b.flags.c_contiguous and b.T.flags.c_contiguous]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemv_dots_takes_only_the_transposed_layout(dtype: Any) -> None:
    k, n = 700, 450
    wt = _RNG.standard_normal((n, k)).astype(dtype)  # (N, K), C-contiguous
    a = _RNG.standard_normal((1, k)).astype(dtype)
    out = np.full((1, n), np.nan, dtype)
    assert gemm.gemv_dots(a, wt.T, out)
    want = a.astype(np.float64) @ wt.T.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert not gemm.gemv_dots(a, np.ascontiguousarray(wt.T), out)  # (K, N) itself: BLAS's
    assert not gemm.gemv_dots(a.astype(np.float32 if dtype is np.float64 else np.float64),
                              wt.T, out)  # fmt: skip


@pytest.mark.usefixtures("dots_pay")
def test_matmul_into_takes_it_for_one_row_by_a_big_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = record_calls(monkeypatch, gemm, "gemv_dots", lambda a, b, out: b)
    wt = _RNG.standard_normal((1000, 400)).astype(np.float32)  # 1.6 MB
    a = _RNG.standard_normal((1, 400)).astype(np.float32)
    got = gemm.matmul_into(a, wt.T)
    assert _taken(seen) == [(400, 1000)]
    np.testing.assert_allclose(got, a @ wt.T, rtol=1e-4, atol=1e-4)
    gemm.matmul_into(np.ones((2, 400), np.float32), wt.T)  # two rows: a gemm
    gemm.matmul_into(a, wt.T[:, :200])  # 0.8 MB: BLAS's gemv
    assert _taken(seen) == [(400, 1000)]


def test_matmul_into_keeps_blas_where_the_host_measured_it_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The choice is this host's measurement, made once per shape; where BLAS's gemv won
    (Zen 3: it reads four rows at once and prefetches), the product stays BLAS's."""
    wt = _RNG.standard_normal((1000, 400)).astype(np.float32)
    measured = gemm.gemv_dots_pays(400, 1000, 4)
    assert gemm._GEMV_DOTS_PAYS[(400, 1000, 4)] is measured
    monkeypatch.setitem(gemm._GEMV_DOTS_PAYS, (400, 1000, 4), False)
    seen = record_calls(monkeypatch, gemm, "gemv_dots", lambda a, b, out: b)
    a = _RNG.standard_normal((1, 400)).astype(np.float32)
    np.testing.assert_allclose(gemm.matmul_into(a, wt.T), a @ wt.T, rtol=1e-4, atol=1e-4)
    assert seen == []


@pytest.mark.usefixtures("dots_pay")
@pytest.mark.parametrize("batch", [1, "n"])
@pytest.mark.parametrize("trans_b", [1, 0])
def test_a_classifier_head_takes_it_in_a_loaded_model(
    monkeypatch: pytest.MonkeyPatch, batch: Any, trans_b: int
) -> None:
    """Gemm + Relu (fused to one Linear), a static or a dynamic batch: one row by the
    (N, K) weights is the dot products, in the planned code; (K, N) weights, and a batch of
    three, are not."""
    k, n = 640, 1000
    w = _RNG.standard_normal((n, k)).astype(np.float32)
    bias = _RNG.standard_normal(n).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=trans_b),
         helper.make_node("Relu", ["g"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w if trans_b else w.T.copy(), "w"),
         numpy_helper.from_array(bias, "b")],
    )  # fmt: skip
    model = tfrt_py.load(helper.make_model(g), executor="sync", threads=1)
    seen = record_calls(monkeypatch, gemm, "gemv_dots", lambda a, b, out: b)
    x = _RNG.standard_normal((1, k)).astype(np.float32)
    for _ in range(2):  # the first call, then the planned code
        y = model.run({"x": x})["y"]
        np.testing.assert_allclose(y, np.maximum(x @ w.T + bias, 0), rtol=1e-4, atol=1e-3)
    assert len(_taken(seen)) == (2 if trans_b else 0), model.describe()
    if batch == "n":
        x3 = _RNG.standard_normal((3, k)).astype(np.float32)
        y3 = model.run({"x": x3})["y"]
        np.testing.assert_allclose(y3, np.maximum(x3 @ w.T + bias, 0), rtol=1e-4, atol=1e-3)
        assert len(_taken(seen)) == (2 if trans_b else 0)
