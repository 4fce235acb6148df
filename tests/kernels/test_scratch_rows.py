"""``kernels.common.scratch_rows``: one scratch row per block of a parallel loop, no cache
line shared by two rows (blocks on different threads wrote one line: a 960x7x7 depthwise
conv at batch 8 ran at one thread's speed on two)."""

from __future__ import annotations

import numpy as np
import pytest

from tfrt_py.kernels.common import scratch_rows

LINE = 64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("length", [1, 15, 16, 65, 81, 1000])
def test_rows_are_long_enough_and_share_no_cache_line(dtype: type, length: int) -> None:
    rows = scratch_rows(0, 4, length, np.dtype(dtype))
    assert rows.shape[0] == 4 and rows.shape[1] >= length and rows.flags.c_contiguous
    item = np.dtype(dtype).itemsize
    for k in range(3):
        last = rows[k].ctypes.data + length * item - 1  # the last byte a block uses
        first = rows[k + 1].ctypes.data
        assert last // LINE < first // LINE, f"rows {k} and {k + 1} share a cache line"
