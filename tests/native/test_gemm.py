"""The packed-weight product kernel (``kernels/lib/gemm_packed``) against NumPy, and the native
tier's use of it for the products of a model with a dynamic batch."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tfrt_py.ir import GraphBuilder
from tfrt_py.kernels.lib import gemm_packed

pytestmark = pytest.mark.skipif(
    gemm_packed.kernel() is None, reason="needs numba and an AVX2/FMA (or aarch64) host"
)

F32 = np.float32


@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 12, 13, 16, 37])
@pytest.mark.parametrize(("k", "n"), [(1, 16), (3, 32), (128, 48), (1024, 80), (2049, 48)])
@pytest.mark.parametrize("flags", [0, 1, 2, 3], ids=["plain", "bias", "relu", "bias-relu"])
def test_product_matches_numpy(m: int, k: int, n: int, flags: int) -> None:
    """Every row count (whole tiles of six and each remainder 1-5), odd depths, several
    panels, several blocks of panels (1024: two panels a block, the last one alone; 2049:
    one a block), each epilogue; operands at offsets inside larger flat arrays, rows strided; a
    NaN in x stays NaN through ReLU."""
    rng = np.random.default_rng(m * 1000 + k + n)
    ldx, ldy = k + 3, n + 16
    x = rng.standard_normal(5 + m * ldx).astype(F32)
    x[5] = np.nan  # row 0, column 0
    w = rng.standard_normal((k, n)).astype(F32)
    bias = np.concatenate([np.zeros(3, F32), rng.standard_normal(n).astype(F32)])
    packed = np.concatenate([np.zeros(7, F32), gemm_packed.pack16(w).ravel()])
    y = np.full(2 + m * ldy, np.nan, F32)
    gemm_packed.kernel()(x, 5, ldx, packed, 7, y, 2, ldy, m, k, n, bias, 3, flags)
    xs = x[5 : 5 + m * ldx].reshape(m, ldx)[:, :k]
    want = xs.astype(np.float64) @ w + (bias[3:] if flags & 1 else 0)
    if flags & 2:
        want = np.where(want < 0, 0, want)  # NaN < 0 is False: NaN stays
    got = y[2 : 2 + m * ldy].reshape(m, ldy)
    assert np.isnan(got[0, :n]).all()
    np.testing.assert_allclose(got[:, :n], want, rtol=1e-5, atol=1e-4)
    assert np.isnan(got[:, n:]).all()  # nothing written past each row's n columns
    assert np.isnan(y[:2]).all()


def test_pack16_lays_out_panels() -> None:
    w = np.arange(3 * 32, dtype=F32).reshape(3, 32)
    p = gemm_packed.pack16(w)
    assert p.shape == (2, 3, 16)
    np.testing.assert_array_equal(p[1, 2], w[2, 16:])


def _mlp(hidden: int) -> Any:
    """MatMul + bias + Relu (a Linear with its epilogue), then a transposed Gemm."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("mlp")
    x = b.input("x", F32, ("B", 24))
    w1 = b.const(rng.standard_normal((24, hidden)).astype(F32))
    b1 = b.const(rng.standard_normal(hidden).astype(F32))
    h = b.op("Relu", b.op("Add", b.op("MatMul", x, w1), b1))
    y = b.op("Gemm", h, b.const(rng.standard_normal((hidden // 2, hidden)).astype(F32)), transB=1)
    b.output(y, "y")
    return b.build()


@pytest.mark.parametrize("hidden", [64, 40], ids=["packed", "width-not-16"])
@pytest.mark.parametrize("batch", [1, 7, 300])
def test_dynamic_batch_products_agree_with_the_interpreter(hidden: int, batch: int) -> None:
    """A Linear layer and a transposed Gemm at several batch sizes (rows mode's tile and
    its single rows); widths that are not multiples of 16 keep NumPy's gemm."""
    g = _mlp(hidden)
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    x = np.random.default_rng(batch).standard_normal((batch, 24)).astype(F32)
    native.run({"x": x})
    native.native.wait()
    assert native.native.state == "ready"
    src = native.native.lowered.source  # rows mode: one module for every batch size
    assert ("gemm_p16(" in src) == (hidden % 16 == 0)
    np.testing.assert_allclose(native.run({"x": x})["y"], sync.run({"x": x})["y"],
                               rtol=1e-5, atol=1e-4)  # fmt: skip


def test_importing_the_module_builds_nothing() -> None:
    """The kernel is built on first use, never at import: a fresh interpreter that imports
    the module has registered no symbol and compiled nothing."""
    code = (
        "import tfrt_py.kernels.lib.gemm_packed as g, sys\n"
        "assert g._STATE == [] and g._KERNEL == [], (g._STATE, g._KERNEL)\n"
        "assert 'numba' not in sys.modules, 'numba imported at import'\n"
        "assert g.kernel() is not None and g._STATE and g._KERNEL\n"
        "from tfrt_py.kernels.lib.gemm_packed import gemm_p16\n"
        "assert gemm_p16 is g.kernel()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
