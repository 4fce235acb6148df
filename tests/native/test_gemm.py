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
from tfrt_py.kernels.lib import blas, gemm_packed
from tfrt_py.native.lower.products import CHAIN_K

pytestmark = pytest.mark.skipif(
    gemm_packed.kernel() is None, reason="needs numba and an AVX2/FMA (or aarch64) host"
)

F32 = np.float32


#: each kernel path and the tile it computes
PATHS = {"avx512": gemm_packed.P32, "avx2": gemm_packed.P16, "neon": gemm_packed.P16}
HOST = gemm_packed.host_paths()


def _path_kernel(path: str) -> Any:
    """The kernel of ``path`` built for this test in an engine of its own, as a ctypes
    function (the process's registered kernel is one path only), and its assembly."""
    import ctypes

    import llvmlite.binding as llvm

    from tfrt_py.concurrency.llvm_jit import compile_ir

    if path not in HOST:
        pytest.skip(f"this host has no {path} path (it has {', '.join(HOST)})")
    text = gemm_packed._build(PATHS[path])
    engine = compile_ir(text, host_cpu=True, opt=3)
    _ENGINES.append(engine)  # keep the machine code alive
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn = ctypes.CFUNCTYPE(i64, ptr, i64, ptr, ptr, i64, i64, i64, i64, ptr, i64, i64)(
        engine.get_function_address(gemm_packed.SYMBOL)
    )
    target = llvm.Target.from_triple(llvm.get_process_triple())
    tm = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )
    return fn, tm.emit_assembly(llvm.parse_assembly(text))


_ENGINES: list[Any] = []


@pytest.fixture(scope="module", params=sorted(PATHS))
def path_kernel(request: pytest.FixtureRequest) -> tuple[str, Any]:
    fn, asm = _path_kernel(request.param)
    if request.param == "avx512":  # the path really computes in zmm registers
        assert "zmm" in asm and "vfmadd" in asm
    return request.param, fn


def _ptr(a: np.ndarray, off: int) -> int:
    return a.ctypes.data + 4 * off


@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7, 8, 9, 13, 37])
@pytest.mark.parametrize(
    ("k", "n"), [(1, 32), (3, 64), (6, 32), (128, 96), (1024, 160), (2049, 64)]
)
@pytest.mark.parametrize("flags", [0, 1, 2, 3], ids=["plain", "bias", "relu", "bias-relu"])
def test_every_path_matches_numpy(
    path_kernel: tuple[str, Any], m: int, k: int, n: int, flags: int
) -> None:
    """Each kernel path the host has: every row count (whole tiles of 6 or 8 and each
    remainder), odd depths, several panels, several blocks of panels (1024 and 2049 deep:
    one or two panels a block, the last alone), each epilogue; operands at offsets inside
    larger flat arrays, rows strided; a NaN in x stays NaN through ReLU, an infinity gives
    infinities and NaNs as NumPy's sums do."""
    path, fn = path_kernel
    shape = PATHS[path]
    rng = np.random.default_rng(m * 1000 + k + n)
    ldx, ldy = k + 3, n + 16
    x = rng.standard_normal(5 + m * ldx).astype(F32)
    x[5] = np.nan  # row 0, column 0
    if m > 1:
        x[5 + ldx] = np.inf  # row 1, column 0
    w = rng.standard_normal((k, n)).astype(F32)
    bias = np.concatenate([np.zeros(3, F32), rng.standard_normal(n).astype(F32)])
    packed = np.concatenate([np.zeros(7, F32), gemm_packed.pack(w, shape).ravel()])
    y = np.full(2 + m * ldy, np.nan, F32)
    status = fn(_ptr(x, 5), ldx, _ptr(packed, 7), _ptr(y, 2), ldy, m, k, n // shape.nr,
                _ptr(bias, 3), flags, shape.nr)  # fmt: skip
    assert status == 0
    xs = x[5 : 5 + m * ldx].reshape(m, ldx)[:, :k]
    with np.errstate(invalid="ignore"):
        want = xs.astype(np.float64) @ w + (bias[3:] if flags & 1 else 0)
    if flags & 2:
        want = np.where(want < 0, 0, want)  # NaN < 0 is False: NaN stays
    got = y[2 : 2 + m * ldy].reshape(m, ldy)
    assert np.isnan(got[0, :n]).all()
    np.testing.assert_allclose(got[:, :n], want, rtol=1e-5, atol=1e-4)
    assert np.isnan(got[:, n:]).all()  # nothing written past each row's n columns
    assert np.isnan(y[:2]).all()
    y[:] = -1
    wrong = fn(_ptr(x, 5), ldx, _ptr(packed, 7), _ptr(y, 2), ldy, m, k, n // shape.nr,
               _ptr(bias, 3), flags, shape.nr // 2)  # fmt: skip
    assert wrong == 1 and (y == -1).all()  # another panel width: refused, nothing written


def test_the_process_kernel_takes_offsets_and_checks_the_width() -> None:
    """The numba wrapper the models call: the process's path, offsets into flat arrays,
    and a ValueError for weights packed to another width."""
    shape = gemm_packed.tile()
    assert shape is not None
    rng = np.random.default_rng(1)
    m, k, n = 13, 70, 2 * shape.nr
    x = rng.standard_normal(4 + m * k).astype(F32)
    w = rng.standard_normal((k, n)).astype(F32)
    packed = np.concatenate([np.zeros(3, F32), gemm_packed.pack(w).ravel()])
    b = rng.standard_normal(n).astype(F32)
    y = np.zeros(m * n, F32)
    gemm_packed.kernel()(x, 4, k, packed, 3, y, 0, n, m, k, n, b, 0, 1, shape.nr)
    want = x[4:].reshape(m, k) @ w + b
    np.testing.assert_allclose(y.reshape(m, n), want, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="panel width"):
        gemm_packed.kernel()(x, 4, k, packed, 3, y, 0, n, m, k, n, b, 0, 1, shape.nr * 2)


@pytest.mark.parametrize("shape", [gemm_packed.P16, gemm_packed.P32], ids=["p16", "p32"])
def test_pack_lays_out_panels(shape: gemm_packed.TileShape) -> None:
    w = np.arange(3 * 64, dtype=F32).reshape(3, 64)
    p = gemm_packed.pack(w, shape)
    nr = shape.nr
    assert p.shape == (64 // nr, 3, nr)
    np.testing.assert_array_equal(p[1, 2], w[2, nr : 2 * nr])


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


@pytest.mark.parametrize(
    "hidden", [64, 40, 200], ids=["packed", "narrow-width-padded", "long-narrow-product-on-blas"]
)
@pytest.mark.parametrize("batch", [1, 7, 300])
@pytest.mark.compiles
def test_dynamic_batch_products_agree_with_the_interpreter(hidden: int, batch: int) -> None:
    """A Linear layer and a transposed Gemm at several batch sizes (rows mode's tile and
    its single rows); a width that is not a multiple of the panel width is padded over at
    most ``CHAIN_K`` terms, and keeps NumPy's gemm over more (the Gemm's 200)."""
    g = _mlp(hidden)
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    x = np.random.default_rng(batch).standard_normal((batch, 24)).astype(F32)
    native.run({"x": x})
    native.native.wait()
    assert native.native.state == "ready"
    src = native.native.lowered.source  # rows mode: one module for every batch size
    shape = gemm_packed.tile()
    assert shape is not None
    assert "sgemm_packed(" in src  # the first product's 24 terms: packed at these widths
    assert ("gemm_f4(" in src) == (hidden > CHAIN_K and blas.available())
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
        "from tfrt_py.kernels.lib.gemm_packed import sgemm_packed\n"
        "assert sgemm_packed is g.kernel()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


_FORCED = """
import json, sys
import numpy as np
import tfrt_py
from tfrt_py.ir import GraphBuilder
from tfrt_py.kernels.lib import gemm_packed
from tfrt_py.kernels.lib.features import format_features

rng = np.random.default_rng(3)
b = GraphBuilder("linear")
x = b.input("x", np.float32, ("B", 24))
w = rng.standard_normal((24, 64)).astype(np.float32)
bias = rng.standard_normal(64).astype(np.float32)
b.output(b.op("Relu", b.op("Add", b.op("MatMul", x, b.const(w)), b.const(bias))), "y")
xv = rng.standard_normal((9, 24)).astype(np.float32)
want = np.maximum(xv @ w + bias, 0)
out = {}
for executor in ("sync", "native"):
    model = tfrt_py.load(b.build(), executor=executor, native="eager")
    got = model.run({"x": xv})["y"]
    out[executor] = float(np.abs(got - want).max())
path, why = gemm_packed.path()
line = [f for f in format_features() if f.startswith("packed gemm")][0]
print(json.dumps({"path": path, "why": why, "line": line, "err": out}))
"""


@pytest.mark.slow  # a fresh process per path (~8 s each)
@pytest.mark.parametrize("asked", [*HOST, "sse9"])  # each path the host has; one it lacks
def test_tfrt_py_isa_forces_a_path_the_host_has(asked: str) -> None:
    """``TFRT_PY_ISA`` picks the path in a fresh process when the host has it (the models'
    products then run on it and agree with NumPy, and ``describe()``'s features line names
    it); a path the host lacks falls back to the host's widest and says why."""
    import json
    import os

    env = {**os.environ, "TFRT_PY_ISA": asked}
    run = subprocess.run([sys.executable, "-c", _FORCED], env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert max(got["err"].values()) < 1e-4, got
    if asked in HOST:
        assert got["path"] == asked and got["why"] == f"$TFRT_PY_ISA={asked}", got
    else:
        assert got["path"] == HOST[0] and "is not a path of this host" in got["why"], got
    if got["path"] == "portable":
        assert got["line"].startswith("packed gemm: off (path portable"), got
    else:
        tile = PATHS[got["path"]]
        assert f"path {got['path']}, {tile.mr}x{tile.nr} tiles" in got["line"], got
