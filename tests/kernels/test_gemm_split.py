"""``gemm.matmul_into``'s split over two threads: by columns when ``b`` is big and wider
than ``a`` is tall (each thread then reads its half of ``b`` once), by rows otherwise;
the same values as NumPy's product either way."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.spies import record_calls
from tfrt_py.concurrency.threads import configure
from tfrt_py.kernels.lib import gemm


@pytest.mark.parametrize(
    ("m", "k", "n", "trans_b", "cols"),
    [
        (150, 1024, 1536, True, True),  # a detector's box head: b 6 MB, transB
        (96, 2048, 1024, False, True),
        (256, 1024, 1536, False, True),
        (150, 256, 1024, True, False),  # b 1 MB: rows, each block finishing its epilogue
        (1536, 1024, 1280, False, False),  # taller than wide: rows
    ],
)
def test_a_wide_big_product_splits_by_columns(
    monkeypatch: pytest.MonkeyPatch, m: int, k: int, n: int, trans_b: bool, cols: bool
) -> None:
    splits = record_calls(monkeypatch, gemm, "native_blocks", lambda a, b, out, t, c=False: c)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n), dtype=np.float32)
    b = b.T if trans_b else b
    configure(2)
    try:
        got = gemm.matmul_into(a, b)
    finally:
        configure(None)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)
    assert splits == [cols]
