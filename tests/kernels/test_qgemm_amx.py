"""The float-storing integer product on AMX tiles (``kernels/lib/qgemm_amx.py``): bit for bit
the ``vnni512`` vector kernel's store, on every shape it splits (whole 32- and 16-row
blocks, the rows left to the vector kernel, k groups that are not whole tiles), and the
symbol numba code calls resolves to it where the host has AMX-INT8 (else it is skipped,
with the reason). ``$TFRT_PY_AMX=0`` keeps the vector kernel (a fresh process)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.support.contrib import edge_codes
from tfrt_py.kernels.lib import qgemm_amx, qgemm_packed

RNG = np.random.default_rng(2036)
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIG = ctypes.CFUNCTYPE(_I, _P, _I, _P, _P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I, _I)


def _need_amx() -> Any:
    """The vector kernel's scaled build, after the process's kernels were decided; skips
    where this process has no AMX kernel."""
    if qgemm_packed.available() is None:
        pytest.skip(f"no integer kernel in this process ({qgemm_packed.path()[1]})")
    if not qgemm_amx.available():
        pytest.skip(f"no AMX kernel here: {qgemm_amx.why()}")
    return qgemm_packed.build("vnni512", scaled=True)


def _case(m: int, k: int, n: int, a_zp: int, seed_zp: bool) -> dict[str, Any]:
    tile = qgemm_packed.TILES["vnni512"]
    a = edge_codes(RNG, (m, k), np.uint8)
    w = edge_codes(RNG, (k, n), np.int8)
    a[0, :], w[:, 0] = 255, -128  # the largest sums
    packed = qgemm_packed.pack(w, tile)
    npad = packed.shape[0] * tile.nr
    wz = np.zeros(npad, np.int32)
    if seed_zp:
        wz[:n] = RNG.integers(-128, 128, n)
    colsum = np.zeros(npad, np.int32)
    colsum[:n] = w.astype(np.int64).sum(axis=0)
    row_term = (a.astype(np.int64).sum(axis=1) - k * a_zp).astype(np.int32)
    scale = np.zeros(npad, np.float32)
    scale[:n] = RNG.uniform(1e-4, 1e-2, n)
    bias = np.zeros(npad, np.float32)
    bias[:n] = RNG.standard_normal(n)
    kp = packed.shape[1] * tile.g
    a2 = np.zeros((m, kp), np.uint8)
    a2[:, :k] = a
    exact = (a.astype(np.int64) - a_zp) @ (w - wz[:n].astype(np.int64))
    return dict(a=a2, packed=packed, colsum=colsum, wz=wz, rows=row_term, scale=scale,
                bias=bias, a_scale=np.array([0.037], np.float32), a_zp=a_zp, n=n,
                npad=npad, exact=exact)  # fmt: skip


def _amx(c: dict[str, Any], y: np.ndarray, p0: int = 0, panels: int | None = None,
         n: int | None = None) -> int:  # fmt: skip
    """The AMX kernel on panels [p0, p0 + panels) of case ``c`` into ``y`` (its columns
    from the first of those panels)."""
    kg, nr = c["packed"].shape[1], qgemm_packed.TILES["vnni512"].nr
    panels = c["packed"].shape[0] - p0 if panels is None else panels
    col = p0 * nr
    fn = _SIG(qgemm_amx.address())
    return int(fn(c["a"].ctypes.data, c["a"].shape[1], c["packed"].ctypes.data + p0 * kg * nr * 4,
                  y.ctypes.data, y.shape[1], c["a"].shape[0], kg, panels,
                  qgemm_packed.layout_code(qgemm_packed.TILES["vnni512"]),
                  c["colsum"].ctypes.data + 4 * col, c["wz"].ctypes.data + 4 * col,
                  c["rows"].ctypes.data, c["scale"].ctypes.data + 4 * col,
                  c["bias"].ctypes.data + 4 * col, c["a_scale"].ctypes.data, c["a_zp"],
                  c["n"] - col if n is None else n))  # fmt: skip


@pytest.mark.parametrize("m", [1, 15, 16, 17, 31, 32, 33, 48, 77])
@pytest.mark.parametrize("k, n", [(64, 16), (256, 33), (1024, 100), (300, 70), (576, 256)])
def test_amx_stores_what_the_vector_kernel_stores(m: int, k: int, n: int) -> None:
    """Every row block (32, 16, the rest on the vector kernel), k groups in whole tiles (64,
    256, 576, 1024) or not (300: the vector kernel throughout), columns that end inside a
    panel or a vector: the same floats as the ``vnni512`` build, bit for bit, and the
    exact products rounded step by step; nothing stored past the last whole vector."""
    built = _need_amx()
    a_zp = int(RNG.integers(0, 256))
    c = _case(m, k, n, a_zp, seed_zp=bool(m % 2))
    want = np.full((m, c["npad"]), np.nan, np.float32)
    qgemm_packed.qgemm_scaled(built, c["a"], c["packed"], m, c["colsum"], c["wz"], c["rows"],
                              c["scale"], c["bias"], c["a_scale"], a_zp, n, want)  # fmt: skip
    got = np.full((m, c["npad"]), np.nan, np.float32)
    assert _amx(c, got) == 0
    np.testing.assert_array_equal(got, want)
    ref = c["exact"].astype(np.float32) * (c["scale"][:n] * c["a_scale"][0]) + c["bias"][:n]
    np.testing.assert_array_equal(got[:, :n], ref)
    assert np.isnan(got[:, -(-n // 16) * 16 :]).all()


@pytest.mark.parametrize("m", [1, 16, 17, 32, 49, 100])
@pytest.mark.parametrize("k, n", [(64, 16), (300, 70), (576, 100)])
def test_the_int32_and_requantizing_builds_store_as_the_vectors(m: int, k: int, n: int) -> None:
    """The int32 build (MatMulInteger, QLinearConv's asymmetric weights) stores the exact
    sums for whole panels; the requantizing one (QLinearConv, QLinearMatMul) the vector
    build's bytes -- bias, scale, clamp at both ends, half to even, zero point -- with
    nothing past the last whole vector of 16."""
    _need_amx()
    tile = qgemm_packed.TILES["vnni512"]
    c = _case(m, k, n, 0, seed_zp=False)
    kg, panels = c["packed"].shape[1], c["packed"].shape[0]
    layout = qgemm_packed.layout_code(tile)
    vec = qgemm_packed.build("vnni512")
    want = qgemm_packed.qgemm(vec, c["a"], c["packed"], m)
    got = np.full_like(want, -7)
    fn = ctypes.CFUNCTYPE(_I, _P, _I, _P, _P, _I, _I, _I, _I, _I)(qgemm_amx.address("int32"))
    assert fn(c["a"].ctypes.data, c["a"].shape[1], c["packed"].ctypes.data, got.ctypes.data,
              got.shape[1], m, kg, panels, layout) == 0  # fmt: skip
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[:, :n], c["exact"])
    for dt, (lo, hi) in ((np.uint8, (0, 255)), (np.int8, (-128, 127))):
        zp = int(RNG.integers(lo, hi + 1))
        params = np.array([lo - zp, hi - zp, zp], np.float32)
        bias = RNG.integers(-(2**20), 2**20, c["npad"]).astype(np.int32)
        scale = RNG.uniform(1e-5, 3e-3, c["npad"]).astype(np.float32)
        ref = np.full((m, c["npad"]), 3, dt)
        qgemm_packed.qgemm_requant(qgemm_packed.build("vnni512", requant=True), c["a"],
                                   c["packed"], m, bias, scale, params, n, ref)  # fmt: skip
        out = np.full((m, c["npad"]), 3, dt)
        rq = ctypes.CFUNCTYPE(_I, _P, _I, _P, _P, _I, _I, _I, _I, _I, _P, _P, _P, _I)(
            qgemm_amx.address("requant")
        )
        assert rq(c["a"].ctypes.data, c["a"].shape[1], c["packed"].ctypes.data,
                  out.ctypes.data, out.shape[1], m, kg, panels, layout, bias.ctypes.data,
                  scale.ctypes.data, params.ctypes.data, n) == 0  # fmt: skip
        np.testing.assert_array_equal(out, ref)
        assert (out[:, -(-n // 16) * 16 :] == 3).all()
        assert {lo, hi} & set(np.unique(out[:, :n]).tolist())  # the clamp was reached


def test_amx_on_a_part_of_the_panels() -> None:
    """The interpreter's parts call the kernel on a range of panels (weights, constants and
    output offset to its first column): the same floats as the whole product there."""
    _need_amx()
    c = _case(40, 256, 200, 9, seed_zp=True)
    whole = np.full((40, c["npad"]), np.nan, np.float32)
    assert _amx(c, whole) == 0
    part = np.full((40, 64), np.nan, np.float32)
    assert _amx(c, part, p0=2, panels=2) == 0
    np.testing.assert_array_equal(part, whole[:, 64:128])


def test_a_matrix_packed_for_another_layout_is_refused() -> None:
    _need_amx()
    c = _case(32, 64, 32, 0, seed_zp=False)
    y = np.full((32, 32), np.nan, np.float32)
    fn = _SIG(qgemm_amx.address())
    st = fn(c["a"].ctypes.data, 64, c["packed"].ctypes.data, y.ctypes.data, 32, 32, 16, 1,
            qgemm_packed.layout_code(qgemm_packed.TILES["avx512"]), c["colsum"].ctypes.data,
            c["wz"].ctypes.data, c["rows"].ctypes.data, c["scale"].ctypes.data,
            c["bias"].ctypes.data, c["a_scale"].ctypes.data, 0, 32)  # fmt: skip
    assert st == 1 and np.isnan(y).all()


def test_numba_code_calls_the_amx_kernel_where_the_host_has_it() -> None:
    """The scaled symbol (MatMulIntegerToFloat on the interpreter and the native tier) is
    the AMX kernel's address, and ``IntegerWeights.product_scaled`` through it equals the
    exact products."""
    _need_amx()
    import llvmlite.binding as llvm

    from tfrt_py.kernels.lib.qgemm_rows import IntegerWeights

    assert llvm.address_of_symbol(qgemm_packed.SYMBOL_SCALED) == qgemm_amx.address()
    assert llvm.address_of_symbol(qgemm_packed.SYMBOL) == qgemm_amx.address("int32")
    assert llvm.address_of_symbol(qgemm_packed.SYMBOL_REQUANT) == qgemm_amx.address("requant")
    assert qgemm_amx.why() == ""
    from tfrt_py.concurrency import native_threads
    from tfrt_py.kernels.lib import qgemm_rows

    if qgemm_rows._SCALED.get() is None:
        why = native_threads.state()[1] or "not running"
        pytest.skip(f"product_scaled's compiled driver is off here (numba's thread layer: "
                    f"{why}); the symbols were checked")  # fmt: skip
    a = edge_codes(RNG, (70, 256), np.uint8)
    w = edge_codes(RNG, (256, 96), np.int8)
    plan = IntegerWeights.make(w, None)
    assert plan is not None
    scale = RNG.uniform(1e-4, 1e-3, 96).astype(np.float32)
    got = plan.product_scaled(a, np.uint8(3), scale, None)
    want = ((a.astype(np.int64) - 3) @ w.astype(np.int64)).astype(np.float32) * scale
    assert got is not None
    np.testing.assert_array_equal(got, want)


def test_the_switch_keeps_the_vector_kernel() -> None:
    """``$TFRT_PY_AMX=0`` (read when the kernels are built): the scaled symbol is the vector
    kernel's, and ``why()`` names the switch."""
    if qgemm_packed.available() is None:
        pytest.skip(f"no integer kernel in this process ({qgemm_packed.path()[1]})")
    code = (
        "import llvmlite.binding as llvm\n"
        "from tfrt_py.kernels.lib import qgemm_amx, qgemm_packed as q\n"
        "q.path()\n"
        "print(qgemm_amx.why())\n"
        "print(llvm.address_of_symbol(q.SYMBOL_SCALED) == "
        "llvm.address_of_symbol(q._VECTORS['scaled']))\n"
    )
    env = {**os.environ, qgemm_amx.ENV_AMX: "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split("\n")  # fmt: skip
    assert out[0] == "$TFRT_PY_AMX=0"
    assert out[1] == "True"
