"""Float32 activations over a run as LLVM IR, called through ctypes: the NumPy paths' GELU
(erf form), Sigmoid and SiLU (the elementwise and contrib kernels, a conv's epilogue)
once a cold start's warm-up has built them, so that a stand-in does not pay ~15 NumPy
passes for erf or four for the logistic in the seconds numba warms (ConvNeXt-Atto's
stand-in at batch 16: 180 of its 410 ms were GELU; EfficientNet-B0's: 135 of 346 SiLU).

Three functions ``f(x, y, n) -> 0`` over ``i < n``:

* ``tfrt_py_gelu_f32``: ``y[i] = (erf(x[i] / sqrt 2) + 1) * x[i] * 0.5``, erf as
  ``erf.erf_f32`` computes it (its argument clamped to [-4, 4], the square floored at
  ``erf.POLY_Z_FLOOR``, the rational approximation ``_P32 / _Q32``) with the Horner steps
  as fused multiply-adds: within a few float32 ulps of ``gelu_numpy``'s;
* ``tfrt_py_sigmoid_f32``: ``y[i] = 1 / (1 + exp(-x[i]))``; ``tfrt_py_silu_f32``:
  ``y[i] = x[i] / (1 + exp(-x[i]))``, exp as ``sigmoid_jit``'s (Cephes' expf: k =
  round(x log2 e), the reduced argument in two parts, a degree-6 polynomial, 2^k as float
  bits; its argument clamped to [-87, 88] so that nothing is subnormal; past 88 exp is
  inf): within a few ulps of NumPy's four passes.

NaN stays NaN. ``x`` and ``y`` are the same run or do not overlap. Vectors of
``pool_ir.lanes()`` floats (16 with AVX-512F, 8 with AVX2), the last one masked: nothing
read or written past ``n``. No numba: ``raw()`` holds the ctypes functions, the GIL
released while they run.

Built once per process by ``build_once()`` (the cold start's warm-up where a loaded model
computes one of them on float32: ``WANTED``), one module, its machine code cached as the
packed gemms'; None where there is no llvmlite JIT or vector path (``$TFRT_PY_ISA=portable``,
no AVX2) or ``$TFRT_PY_PACKED_GEMM=0``. Stateless; any thread.
"""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

import numpy as np

from ...concurrency.env_switch import switched_off
from ...concurrency.once import Once
from .erf import _P32, _Q32, POLY_Z_FLOOR
from .gemm_packed import ENV_PACKED_GEMM, counted_loop, splat, wide_vectors
from .ir_kernels import FloatVectors, build_module
from .pool_ir import lanes
from .sigmoid_jit import EXP_CONSTS

__all__ = ["SYMBOLS", "WANTED", "Kernels", "build", "build_once", "gelu", "logistic", "raw"]

SYMBOLS = ("tfrt_py_gelu_f32", "tfrt_py_sigmoid_f32", "tfrt_py_silu_f32")


class Kernels(NamedTuple):
    """The ctypes functions ``f(x, y, n)`` (addresses as integers)."""

    gelu: Any
    sigmoid: Any
    silu: Any


class _ActivationIR(FloatVectors):
    """The module: each of ``SYMBOLS`` a loop over whole vectors, then the masked rest."""

    def __init__(self, n: int) -> None:
        super().__init__(n, "tfrt_py_activations")
        self.floor = self.ir.Function(self.mod, self.ir.FunctionType(self.vf, [self.vf]),
                                      name=f"llvm.floor.v{n}f32")  # fmt: skip

    def splat(self, v: float) -> Any:
        return self.ir.Constant(self.vf, [float(np.float32(v))] * self.n)

    def horner(self, b: Any, z: Any, coeffs: Any) -> Any:
        r = b.call(self.fma, [self.splat(coeffs[0]), z, self.splat(coeffs[1])])
        for c in coeffs[2:]:
            r = b.call(self.fma, [r, z, self.splat(c)])
        return r

    def gelu(self, b: Any, v: Any) -> Any:
        """GELU of the vector ``v`` (``erf.erf_f32``'s steps; Horner with FMAs)."""
        t = b.fmul(v, self.splat(1.0 / math.sqrt(2.0)))
        lo, hi, floor = self.splat(-4.0), self.splat(4.0), self.splat(POLY_Z_FLOOR)
        # clamps that keep NaN (an ordered compare is false for it)
        t = b.select(b.fcmp_ordered("<", t, lo), lo, t)
        t = b.select(b.fcmp_ordered(">", t, hi), hi, t)
        z = b.fmul(t, t)
        z = b.select(b.fcmp_ordered("<", z, floor), floor, z)
        erf = b.fdiv(b.fmul(self.horner(b, z, _P32), t), self.horner(b, z, _Q32))
        return b.fmul(b.fmul(b.fadd(erf, self.splat(1.0)), v), self.splat(0.5))

    def one_plus_exp(self, b: Any, x0: Any) -> Any:
        """1 + exp(``x0``) (``sigmoid_jit._sigmoid_flat``'s exp: NaN kept, inf past 88)."""
        c = [float(v) for v in EXP_CONSTS]
        log2e, ln2hi, ln2lo, p, one, half = c[0], c[1], c[2], c[3:9], c[9], c[10]
        lo, hi = self.splat(c[11]), self.splat(c[12])
        x = b.select(b.fcmp_ordered(">=", x0, lo), x0, lo)  # NaN -> lo (a defined int)
        x = b.select(b.fcmp_ordered(">", x, hi), hi, x)
        fk = b.call(self.floor, [b.fadd(b.fmul(x, self.splat(log2e)), self.splat(half))])
        r = b.call(self.fma, [fk, self.splat(-ln2hi), x])
        r = b.call(self.fma, [fk, self.splat(-ln2lo), r])
        poly = b.call(self.fma, [self.horner(b, r, p), b.fmul(r, r), r])
        e = b.fadd(poly, self.splat(one))
        e = b.select(b.fcmp_unordered("uno", x0, x0), x0, e)
        e = b.select(b.fcmp_ordered(">", x0, hi), self.splat(math.inf), e)
        bias = self.ir.Constant(self.vi, [127] * self.n)
        shift = self.ir.Constant(self.vi, [23] * self.n)
        kf = b.bitcast(b.shl(b.add(b.fptosi(fk, self.vi), bias), shift), self.vf)
        return b.call(self.fma, [e, kf, self.splat(one)])

    def sigmoid(self, b: Any, v: Any) -> Any:
        return b.fdiv(self.splat(1.0), self.one_plus_exp(b, b.fneg(v)))

    def silu(self, b: Any, v: Any) -> Any:
        return b.fdiv(v, self.one_plus_exp(b, b.fneg(v)))

    def function(self, name: str, op: Any) -> None:
        ir, c, L = self.ir, self.c, self.n
        fn = ir.Function(self.mod, ir.FunctionType(self.i64, [self.fp, self.fp, self.i64]),
                         name=name)  # fmt: skip
        x, y, n = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        vp = self.vf.as_pointer()

        def at(p: Any, i: Any) -> Any:
            return b.bitcast(b.gep(p, [i]), vp)

        def step(i: Any) -> None:
            b.store(op(b, b.load(at(x, i), align=4)), at(y, i), align=4)

        whole = b.mul(b.sdiv(n, c(L)), c(L))
        counted_loop(b, c(0), whole, L, step)
        rest = b.trunc(b.sub(n, whole), self.i32)
        mask = b.icmp_signed("<", self.iota, splat(b, rest, L))
        four = ir.Constant(self.i32, 4)
        v = b.call(self.mload, [at(x, whole), four, mask, self.zero])
        b.call(self.mstore, [op(b, v), at(y, whole), four, mask])
        b.ret(c(0))

    def text(self) -> str:
        for name, op in zip(SYMBOLS, (self.gelu, self.sigmoid, self.silu)):
            self.function(name, op)
        text = str(self.mod)
        return wide_vectors(text, list(SYMBOLS)) if self.n * 32 > 256 else text


def build(n: int) -> Kernels:
    """The ctypes functions over the module built for vectors of ``n`` floats (one of
    ``pool_ir.host_lanes()``), its engine kept alive; raises what llvmlite raises."""
    import ctypes

    engine = build_module(lambda: _ActivationIR(n).text(), f"activation_ir|{n}", __file__)
    _ENGINES.append(engine)
    fp = ctypes.c_void_p
    kernel = ctypes.CFUNCTYPE(ctypes.c_int64, fp, fp, ctypes.c_int64)
    return Kernels(*(kernel(engine.get_function_address(s)) for s in SYMBOLS))


_ENGINES: list[Any] = []  # kept alive: the functions point into them


def _decide() -> Kernels | None:
    if switched_off(ENV_PACKED_GEMM):
        return None
    try:
        n = lanes()
        return build(n) if n else None
    except Exception:  # noqa: BLE001 - no llvmlite JIT here: the NumPy paths serve
        return None


_BUILT: Once[Kernels | None] = Once(_decide)
#: Set once a loaded model computes a float32 GELU, Sigmoid or SiLU on the NumPy paths
#: (any thread): the cold start's warm-up then builds the module early.
WANTED = threading.Event()


def build_once() -> Kernels | None:
    """The ctypes functions, built now if they were not (None where they cannot be). The
    cold start's warm-up calls it; thread-safe."""
    return _BUILT.get()


def raw() -> Kernels | None:
    """The ctypes functions once built (``build_once``), else None; never builds (one
    read: the NumPy paths ask it per call)."""
    return _BUILT.peek()


def _run(which: int, x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    kernels = _BUILT.peek()
    if kernels is None or x.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    if out is None:
        out = np.empty_like(x)
    elif (
        out.dtype != np.float32 or out.shape != x.shape or not out.flags.c_contiguous
        or (out.ctypes.data != x.ctypes.data and np.may_share_memory(x, out))
    ):  # fmt: skip
        return None
    kernels[which](x.ctypes.data, out.ctypes.data, x.size)
    return out


def gelu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """GELU of float32 ``x`` into ``out`` (``x`` itself, another array of its shape and
    dtype that does not overlap it, or None: a new one) on the built kernel; None where it
    is not built or does not apply (another dtype, not C-contiguous, a partial overlap):
    the caller takes NumPy's path."""
    return _run(0, x, out)


def logistic(x: np.ndarray, out: np.ndarray | None, silu: bool) -> np.ndarray | None:
    """Sigmoid (or with ``silu`` x * sigmoid(x)) of float32 ``x`` into ``out``, as
    ``gelu`` takes them; None where ``gelu`` would be."""
    return _run(2 if silu else 1, x, out)
