"""The decode-attention kernels generated code calls (``native/kernels/rowdot.py``): one
query row's scores against key rows (``dot_rows_f4``) and its softmax times the value rows
(``softmax_rows_f4``), at offsets inside flat buffers, against NumPy in float64, for row
counts on and off their four-row step; what they leave untouched; NaN propagating."""

from __future__ import annotations

import numpy as np
import pytest

rowdot = pytest.importorskip("tfrt_py.native.kernels.rowdot", reason="numba is not installed")


@pytest.mark.parametrize("n", [1, 3, 4, 7, 513])
@pytest.mark.parametrize("k", [16, 64])
def test_scores_then_softmax_times_values_match_numpy(n: int, k: int) -> None:
    rng = np.random.default_rng(n * 100 + k)
    q = rng.standard_normal(k + 5).astype(np.float32)  # the row at offset 5
    keys = rng.standard_normal(3 + n * k).astype(np.float32)  # rows from offset 3
    vals = rng.standard_normal(2 + n * k).astype(np.float32)  # rows from offset 2
    w = np.full(n + 4, np.nan, np.float32)  # scores at offset 4
    y = np.full(k + 6, np.nan, np.float32)  # the output at offset 6
    rowdot.dot_rows_f4(q, 5, keys, 3, w, 4, n, k, np.float32(0.125))
    K = keys[3:].reshape(n, k).astype(np.float64)
    s = 0.125 * (K @ q[5:].astype(np.float64))
    np.testing.assert_allclose(w[4:], s, rtol=1e-5, atol=1e-6)
    assert np.isnan(w[:4]).all()
    rowdot.softmax_rows_f4(w, 4, n, vals, 2, k, y, 6)
    e = np.exp(s - s.max())
    np.testing.assert_allclose(w[4:], e, rtol=1e-5, atol=1e-7)  # the exponentials, in place
    want = (e / e.sum()) @ vals[2:].reshape(n, k).astype(np.float64)
    np.testing.assert_allclose(y[6:], want, rtol=1e-5, atol=1e-6)
    assert np.isnan(y[:6]).all()


def test_a_nan_score_gives_nan_outputs() -> None:
    w = np.array([0.5, np.nan, 1.0, 2.0, 0.0], np.float32)
    v = np.ones(5 * 8, np.float32)
    y = np.zeros(8, np.float32)
    rowdot.softmax_rows_f4(w, 0, 5, v, 0, 8, y, 0)
    assert np.isnan(y).all()
