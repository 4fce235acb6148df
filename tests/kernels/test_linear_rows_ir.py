"""The LLVM IR kernel of a linear model's sums over many rows (``kernels/lib/linear_rows_ir``):
on every vector width the host has, each row's sums are the bits of the fused multiply-add
chain a generated module's one-row body computes, on shapes around the vector and tile
edges (rows past a pass, features past a transposed tile and past the stack block, classes
past a chunk), with NaN and infinities among the values; nothing past the rows is written."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the kernel is LLVM IR built with llvmlite")
numba = pytest.importorskip("numba", reason="the reference is the one-row body's numba loop")

from tests.support.jit_paths import ir_lanes, need_lanes  # noqa: E402
from tfrt_py.kernels.lib import linear_rows_ir  # noqa: E402

_PROTO = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)  # fmt: skip


@numba.njit(fastmath={"contract"})
def _one_row_sums(x, m, f, w, n, s):  # pragma: no cover - compiled
    """``svm.linear_cls_row``'s sums as a generated module compiles them (contracted)."""
    for r in range(m):
        for j in range(n):
            a = np.float32(0.0)
            for i in range(f):
                a += x[r * f + i] * w[i * n + j]
            s[r * n + j] = a


SHAPES = [  # (rows, features, classes)
    (1, 1, 1), (7, 5, 3), (15, 16, 1), (16, 17, 2), (17, 20, 3), (31, 3, 4), (32, 33, 5),
    (33, 64, 9), (64, 65, 3), (100, 130, 2), (3, 200, 7), (0, 4, 2),
    (64, 7, 4), (32, 16, 1), (96, 9, 2),  # whole passes of every class: the shuffled store
]  # fmt: skip


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_every_width_sums_rows_as_the_one_row_body(lanes: int) -> None:
    need_lanes(lanes)
    engine = linear_rows_ir.build(lanes)
    fn = _PROTO(engine.get_function_address(linear_rows_ir.SYMBOL))
    rng = np.random.default_rng(lanes)
    for case, (m, f, n) in enumerate(SHAPES):
        x = rng.standard_normal(m * f).astype(np.float32)
        w = rng.standard_normal(f * n).astype(np.float32)
        if case % 3 == 1 and m * f:
            x[rng.integers(0, m * f, size=max(1, m * f // 20))] = np.nan
            x[0] = np.inf
        s = np.full(m * n + 8, 7.0, np.float32)  # sentinels past the rows
        want = s.copy()
        assert fn(x.ctypes.data, m, f, w.ctypes.data, n, s.ctypes.data) == 0
        _one_row_sums(x, m, f, w, n, want)
        np.testing.assert_array_equal(s, want, err_msg=f"{lanes} lanes, shape {(m, f, n)}")


def test_the_process_width_is_described_and_can_be_switched_off(monkeypatch) -> None:
    """``describe()`` and the feature table's packed-gemm line name the width in use;
    ``$TFRT_PY_PACKED_GEMM=0`` turns the kernel off (the numba loop serves)."""
    if not ir_lanes():
        pytest.skip("this host has no AVX2 (or no llvmlite JIT): the numba loop serves")
    if linear_rows_ir.kernel() is None:
        pytest.skip("the packed kernels are off in this process ($TFRT_PY_ISA=portable)")
    assert f"vectors of {linear_rows_ir.lanes()} rows" in linear_rows_ir.describe()
    from tfrt_py.kernels.lib import gemm_packed
    from tfrt_py.kernels.lib.features import format_features

    if gemm_packed.kernel() is not None:  # the packed gemm's line names the kernel too
        (line,) = [ln for ln in format_features() if ln.startswith("packed gemm")]
        assert f"linear models' rows: vectors of {linear_rows_ir.lanes()} rows" in line
    monkeypatch.setenv("TFRT_PY_PACKED_GEMM", "0")
    assert linear_rows_ir.kernel() is None
