"""Rows mode binds a narrow row (fewer than ``ROW_VIEW_MIN`` elements) as an offset into
the flat feed or output, a wide one as a view from the row (``rows_source.row_refs``):
both forms in one module, a feed returned as an output, every batch size."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import tfrt_py
from tfrt_py.ir import Graph, GraphBuilder

pytest.importorskip("numba", reason="the native tier needs numba")

rows_source = importlib.import_module("tfrt_py.native.lower.rows_source")
RNG = np.random.default_rng(71)
WIDE = rows_source.ROW_VIEW_MIN + 4


def _graph() -> Graph:
    b = GraphBuilder("row_views")
    a = b.input("a", np.float32, ("N", 3))
    w = b.input("w", np.float32, ("N", WIDE))
    b.output(b.op("Sigmoid", a), "narrow")
    b.output(b.op("Mul", w, b.const(np.float32(2.0))), "wide")
    b.output(b.op("ReduceSum", w, b.const(np.array([1], np.int64)), keepdims=1), "sum")
    b.output(b.op("Identity", a), "feed")  # the identity pass leaves the feed itself
    return b.build()


def test_narrow_rows_are_offsets_and_wide_rows_views() -> None:
    native = tfrt_py.load(_graph(), executor="native", native="eager")
    sync = tfrt_py.load(_graph(), executor="sync")
    assert native.native.form == "rows"
    source = native.native.lowered.source
    assert "xo0 = rw * 3" in source and f"xv1 = x1[rw * {WIDE}:]" in source
    assert "ro0 = rw * 3" in source and f"rv1 = r1[rw * {WIDE}:]" in source
    assert "ro2 = rw * 1" in source
    assert "xv0" not in source and "rv0" not in source  # no view made for a narrow row
    for n in (0, 1, 2, 7, 300):
        feeds = {"a": RNG.standard_normal((n, 3)).astype(np.float32),
                 "w": RNG.standard_normal((n, WIDE)).astype(np.float32)}  # fmt: skip
        got, want = native.run(feeds), sync.run(feeds)
        for k, v in want.items():
            assert got[k].shape == v.shape, k
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
