"""The float32 logistic's and erf's polynomials make no subnormal numbers from normal inputs.

Their highest terms (6.1e-13 x^2 in the logistic's Q, -2.7e-10 x^2 in erf's P) are
subnormal for |x| below ~1e-13 where no fused multiply-add hides them, and each operation
that makes one costs ~100 cycles on Intel cores (EfficientNet-B0's SiLUs on activations
of ~1e-12: 2.5x their time). ``erf.POLY_Z_FLOOR`` floors their squares at 1e-20. What is
checked: the CPU's underflow flag (MXCSR bit 4, read and cleared by a two-instruction
LLVM function) stays clear over the compiled loops on such inputs, NumPy reports no
underflow for the interpreter's erf, and every result is the unfloored formula's, bit for
bit, from 1e-40 to 1e4.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tfrt_py.kernels.lib import erf as erf_mod
from tfrt_py.kernels.lib.activations import _LOGISTIC, Epilogue, _act_row, _params
from tfrt_py.kernels.lib.jit import jit_enabled

F32 = np.float32
_UNDERFLOW = 0x10  # MXCSR's sticky underflow flag

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"),
    reason="reads the x86 MXCSR register's underflow flag",
)

_MXCSR_IR = """
declare void @llvm.x86.sse.stmxcsr(i8*)
declare void @llvm.x86.sse.ldmxcsr(i8*)
define i32 @mxcsr_take() {
  %p = alloca i32, align 4
  %q = bitcast i32* %p to i8*
  call void @llvm.x86.sse.stmxcsr(i8* %q)
  %v = load i32, i32* %p
  %c = and i32 %v, -64
  store i32 %c, i32* %p
  call void @llvm.x86.sse.ldmxcsr(i8* %q)
  ret i32 %v
}
"""


@pytest.fixture(scope="module")
def mxcsr_take() -> Callable[[], int]:
    """This thread's MXCSR, its six exception flags cleared after the read."""
    from tfrt_py.concurrency.llvm_jit import compile_ir

    engine = compile_ir(_MXCSR_IR)
    fn = ctypes.CFUNCTYPE(ctypes.c_uint32)(engine.get_function_address("mxcsr_take"))
    fn._engine = engine  # type: ignore[attr-defined]  # keeps the machine code alive
    return fn


def _tiny(n: int = 4096) -> np.ndarray:
    """Normal floats whose squares' products with the top coefficients are subnormal."""
    rng = np.random.default_rng(0)
    mag = 10.0 ** rng.uniform(-17, -14, n)
    return (mag * rng.choice([-1.0, 1.0], n)).astype(F32)


def _wide() -> np.ndarray:
    """Both signs, magnitudes 1e-40..1e4, zeros, and the floor's square root's neighbours."""
    m = np.logspace(-40, 4, 4001).astype(F32)
    f = F32(np.sqrt(erf_mod.POLY_Z_FLOOR))
    edge = np.array([f, np.nextafter(f, F32(0)), np.nextafter(f, F32(1)), 0.0], F32)
    return np.concatenate([m, -m, edge, -edge])


def _logistic_unfloored(v: np.ndarray, silu: bool) -> np.ndarray:
    """The logistic as ``_act_row`` computed it before the floor, in NumPy float32 (the
    same operations in the same order)."""
    c = [F32(x) for x in _LOGISTIC]
    lo, hi, a9, a7, a5, a3, a1, b10, b8, b6, b4, b2, b0 = c
    with np.errstate(under="ignore"):
        t = np.minimum(np.maximum(v, lo), hi)
        z = t * t
        pp = ((((a9 * z + a7) * z + a5) * z + a3) * z + a1) * t
        q = ((((b10 * z + b8) * z + b6) * z + b4) * z + b2) * z + b0
        s = np.clip(pp / q + F32(0.5), F32(0), F32(1))
        return v * s if silu else s


def _gelu_unfloored(v: np.ndarray) -> np.ndarray:
    """``_act_row``'s and ``gelu_jit``'s GELU before the floor, in NumPy float32."""
    p = [F32(x) for x in erf_mod._P32]
    q = [F32(x) for x in erf_mod._Q32]
    with np.errstate(under="ignore"):
        t = np.minimum(np.maximum(v * F32(1.0 / np.sqrt(2.0)), F32(-4)), F32(4))
        z = t * t
        pp = (((((p[0] * z + p[1]) * z + p[2]) * z + p[3]) * z + p[4]) * z + p[5]) * z + p[6]
        qq = (((q[0] * z + q[1]) * z + q[2]) * z + q[3]) * z + q[4]
        return ((pp * t) / qq + F32(1)) * v * F32(0.5)


@pytest.fixture(scope="module")
def act_row() -> Any:
    if not jit_enabled():
        pytest.skip("numba is off (TFRT_PY_JIT=0 or not installed): no compiled loops")
    import numba

    return numba.njit(_act_row)  # no fast-math: every product is rounded on its own


@pytest.mark.parametrize(("name", "want"), [
    ("Sigmoid", lambda v: _logistic_unfloored(v, False)),
    ("SiLU", lambda v: _logistic_unfloored(v, True)),
    ("Gelu", _gelu_unfloored),
])  # fmt: skip
def test_act_row_makes_no_subnormals_and_keeps_every_bit(
    act_row: Any, mxcsr_take: Callable[[], int], name: str, want: Callable[..., np.ndarray]
) -> None:
    from tfrt_py.kernels.lib.activations import ACTIVATIONS

    p, code, bm = _params(Epilogue(name), np.dtype(F32)), ACTIVATIONS[name], F32(-0.0)
    y = _tiny()
    act_row(y.copy(), bm, code, p)  # compiled before the flags are read
    mxcsr_take()
    act_row(y, bm, code, p)
    flags = mxcsr_take()
    assert not flags & _UNDERFLOW, f"{name}: a subnormal was made (MXCSR {flags:#x})"
    for v in (_tiny(), _wide()):
        got = v.copy()
        act_row(got, bm, code, p)
        np.testing.assert_array_equal(got, want(v), err_msg=name)


def test_gelu_jit_makes_no_subnormals_and_keeps_every_bit(mxcsr_take: Callable[[], int]) -> None:
    from tfrt_py.kernels.lib.gelu_jit import gelu_erf_f32

    gelu = gelu_erf_f32()
    if gelu is None:
        pytest.skip("numba is off (TFRT_PY_JIT=0 or not installed): no compiled GELU")
    x = _tiny()
    gelu(x, None)
    mxcsr_take()
    y = gelu(x, None)
    flags = mxcsr_take()
    assert not flags & _UNDERFLOW, f"a subnormal was made (MXCSR {flags:#x})"
    for v in (x, _wide()):
        np.testing.assert_array_equal(gelu(v, None), _gelu_unfloored(v))
    assert y is not None


def test_numpy_erf_reports_no_underflow_and_keeps_every_bit() -> None:
    x = _tiny()
    with np.errstate(under="raise"):  # NumPy reads the same flag after each ufunc
        erf_mod.erf_f32(x)
    p = [F32(c) for c in erf_mod._P32]
    q = [F32(c) for c in erf_mod._Q32]
    for v in (x, _wide()):
        with np.errstate(under="ignore"):
            t = np.minimum(np.maximum(v, F32(-4)), F32(4))
            z = t * t
            pp = p[0] * z + p[1]
            for c in p[2:]:
                pp = pp * z + c
            qq = q[0] * z + q[1]
            for c in q[2:]:
                qq = qq * z + c
            want = (pp * t) / qq
            got = erf_mod.erf_f32(v)
        np.testing.assert_array_equal(got, want)
