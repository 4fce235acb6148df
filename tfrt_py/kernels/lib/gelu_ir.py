"""GELU (the erf form) over a float32 run as LLVM IR, called through ctypes: the NumPy
paths' Gelu (the elementwise and contrib kernels' ``gelu_numpy.gelu_erf``, a conv's
epilogue) once a cold start's warm-up has built it, so that a stand-in does not pay erf's
~15 NumPy passes for the seconds numba warms (ConvNeXt-Atto's stand-in at batch 16: 180
of its 410 ms were GELU).

``tfrt_py_gelu_f32(x, y, n) -> 0``: ``y[i] = (erf(x[i] / sqrt 2) + 1) * x[i] * 0.5`` for
``i < n``, erf as ``erf.erf_f32`` computes it (its argument clamped to [-4, 4], the square
floored at ``erf.POLY_Z_FLOOR``, the rational approximation ``_P32 / _Q32``) with the
Horner steps as fused multiply-adds: within a few float32 ulps of ``gelu_numpy``'s (NaN
kept). ``x`` and ``y`` are the same run or do not overlap. Vectors of ``pool_ir.lanes()``
floats (16 with AVX-512F, 8 with AVX2), the last one masked: nothing read or written past
``n``. No numba: ``raw()`` is the ctypes function, the GIL released while it runs.

Built once per process by ``build_once()`` (the cold start's warm-up where a loaded
model computes a float32 GELU: ``WANTED``), its machine code cached as the packed gemms'; None
where there is no llvmlite JIT or vector path (``$TFRT_PY_ISA=portable``, no AVX2) or
``$TFRT_PY_PACKED_GEMM=0``. Stateless; any thread.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from ...concurrency.env_switch import switched_off
from ...concurrency.once import Once
from .erf import _P32, _Q32, POLY_Z_FLOOR
from .gemm_packed import ENV_PACKED_GEMM, counted_loop, splat, wide_vectors
from .ir_kernels import FloatVectors, build_module
from .pool_ir import lanes

__all__ = ["SYMBOL", "WANTED", "build", "build_once", "raw", "run"]

SYMBOL = "tfrt_py_gelu_f32"


class _GeluIR(FloatVectors):
    """The module: ``SYMBOL``, a loop over whole vectors, then the masked rest."""

    def __init__(self, n: int) -> None:
        super().__init__(n, "tfrt_py_gelu")

    def splat(self, v: float) -> Any:
        return self.ir.Constant(self.vf, [float(np.float32(v))] * self.n)

    def gelu(self, b: Any, v: Any) -> Any:
        """GELU of the vector ``v`` (``erf.erf_f32``'s steps; Horner with FMAs)."""
        t = b.fmul(v, self.splat(1.0 / math.sqrt(2.0)))
        lo, hi, floor = self.splat(-4.0), self.splat(4.0), self.splat(POLY_Z_FLOOR)
        # clamps that keep NaN (an ordered compare is false for it)
        t = b.select(b.fcmp_ordered("<", t, lo), lo, t)
        t = b.select(b.fcmp_ordered(">", t, hi), hi, t)
        z = b.fmul(t, t)
        z = b.select(b.fcmp_ordered("<", z, floor), floor, z)

        def horner(coeffs: tuple[Any, ...]) -> Any:
            r = b.call(self.fma, [self.splat(coeffs[0]), z, self.splat(coeffs[1])])
            for c in coeffs[2:]:
                r = b.call(self.fma, [r, z, self.splat(c)])
            return r

        erf = b.fdiv(b.fmul(horner(_P32), t), horner(_Q32))
        return b.fmul(b.fmul(b.fadd(erf, self.splat(1.0)), v), self.splat(0.5))

    def text(self) -> str:
        ir, c, L = self.ir, self.c, self.n
        fn = ir.Function(self.mod, ir.FunctionType(self.i64, [self.fp, self.fp, self.i64]),
                         name=SYMBOL)  # fmt: skip
        x, y, n = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        vp = self.vf.as_pointer()

        def at(p: Any, i: Any) -> Any:
            return b.bitcast(b.gep(p, [i]), vp)

        def step(i: Any) -> None:
            b.store(self.gelu(b, b.load(at(x, i), align=4)), at(y, i), align=4)

        whole = b.mul(b.sdiv(n, c(L)), c(L))
        counted_loop(b, c(0), whole, L, step)
        rest = b.trunc(b.sub(n, whole), self.i32)
        mask = b.icmp_signed("<", self.iota, splat(b, rest, L))
        four = ir.Constant(self.i32, 4)
        v = b.call(self.mload, [at(x, whole), four, mask, self.zero])
        b.call(self.mstore, [self.gelu(b, v), at(y, whole), four, mask])
        b.ret(c(0))
        text = str(self.mod)
        return wide_vectors(text, [SYMBOL]) if L * 32 > 256 else text


def build(n: int) -> Any:
    """The ctypes function over the kernel built for vectors of ``n`` floats (one of
    ``pool_ir.host_lanes()``), its engine kept alive; raises what llvmlite raises."""
    import ctypes

    engine = build_module(lambda: _GeluIR(n).text(), f"gelu_ir|{n}", __file__)
    _ENGINES.append(engine)
    fp = ctypes.c_void_p
    kernel = ctypes.CFUNCTYPE(ctypes.c_int64, fp, fp, ctypes.c_int64)
    return kernel(engine.get_function_address(SYMBOL))


_ENGINES: list[Any] = []  # kept alive: the functions point into them


def _decide() -> Any:
    if switched_off(ENV_PACKED_GEMM):
        return None
    try:
        n = lanes()
        return build(n) if n else None
    except Exception:  # noqa: BLE001 - no llvmlite JIT here: the NumPy paths serve
        return None


_BUILT: Once[Any] = Once(_decide)
#: Set once a loaded model computes a float32 GELU on the NumPy paths (any thread): the
#: cold start's warm-up then builds the kernel first.
WANTED = threading.Event()


def build_once() -> Any:
    """The ctypes function, built now if it was not (None where it cannot be). The cold
    start's warm-up calls it; thread-safe."""
    return _BUILT.get()


def raw() -> Any:
    """The ctypes function once built (``build_once``), else None; never builds (one read:
    the NumPy paths ask it per call)."""
    return _BUILT.peek()


def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """GELU of float32 ``x`` into ``out`` (``x`` itself, another array of its shape and
    dtype that does not overlap it, or None: a new one) on the built kernel; None where it
    is not built or does not apply (another dtype, not C-contiguous, a partial overlap):
    the caller takes NumPy's path."""
    fn = _BUILT.peek()
    if fn is None or x.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    if out is None:
        out = np.empty_like(x)
    elif (
        out.dtype != np.float32 or out.shape != x.shape or not out.flags.c_contiguous
        or (out.ctypes.data != x.ctypes.data and np.may_share_memory(x, out))
    ):  # fmt: skip
        return None
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out
