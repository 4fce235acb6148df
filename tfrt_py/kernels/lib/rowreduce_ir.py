"""A float32 row's maximum and sum in vector registers, as LLVM IR: the two reductions of a
long row's softmax in generated native code (``native/lower/ops._softmax``: a decode
step's or an encoder's attention rows).

``rowmax(x, n) -> float``: the largest of ``x[:n]``, NaN if any is NaN (the generated
loops' rule: NaN wins), -inf for ``n`` = 0; where +0 and -0 tie either may come back (the
softmax subtracts it: the same exponentials). ``rowsum(x, n) -> float``: their sum,
reassociated (``ACCUMULATORS`` vectors of lanes, added pairwise, then across the lanes),
as the generated loops' four partial sums already were; NaN and infinities propagate.
Both read ``x[:n]`` only (the last vector masked).

What they replace: the generated loops keep four scalar chains (a compare and a select,
or an add, waiting on the one before): at rows of 513 about a fifth of a nanosecond an
element on Zen 5, where a vector of 16 takes about the same time.

``kernels()`` is the numba wrappers ``(rowmax_f4(x, xo, n), rowsum_f4(x, xo, n))`` (a flat
float32 array, an element offset; the caller checks the bounds), None where there is no
llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable`` or the packed kernels are switched off;
``from ...rowreduce_ir import rowmax_f4, rowsum_f4`` (the generated modules' form) builds
them. Vectors of 16 floats with AVX-512F, 8 with AVX2, as ``pool_ir``'s widths. Built once
per process under a lock (its machine code cached as the packed gemms'); stateless; any
thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .gemm_packed import carried_loop, splat, wide_vectors
from .ir_kernels import FloatVectors, WrappedKernels, build_module
from .pool_ir import host_lanes, lanes

__all__ = ["ACCUMULATORS", "SYMBOL_MAX", "SYMBOL_SUM", "build", "describe", "host_lanes",
           "kernels", "lanes"]  # fmt: skip

SYMBOL_MAX = "tfrt_py_rowmax_f32"
SYMBOL_SUM = "tfrt_py_rowsum_f32"
#: independent vector accumulators (a compare or an add waits on its own chain only)
ACCUMULATORS = 4


def build(n: int) -> Any:
    """The engine holding both kernels for vectors of ``n`` floats (one of
    ``host_lanes()``): for tests and benchmarks of a width apart from the process's.
    Raises what llvmlite raises."""
    return build_module(lambda: _RowReduceIR(n).text(), f"rowreduce_ir|{n}", __file__)


class _RowReduceIR(FloatVectors):
    """The module: ``SYMBOL_MAX`` and ``SYMBOL_SUM``, one loop each over whole groups of
    ``ACCUMULATORS`` vectors, then single vectors, then the masked rest."""

    def __init__(self, n: int) -> None:
        super().__init__(n, "tfrt_py_rowreduce")

    def text(self) -> str:
        self.reduce(SYMBOL_MAX, float("-inf"), self.max_of)
        self.reduce(SYMBOL_SUM, 0.0, lambda b, x, y: b.fadd(x, y))
        text = str(self.mod)
        return wide_vectors(text, [SYMBOL_MAX, SYMBOL_SUM], "float") if self.n * 32 > 256 else text

    @staticmethod
    def max_of(b: Any, x: Any, y: Any) -> Any:
        """The larger of ``x`` and ``y`` lane by lane (``x`` where ``y`` is not larger: a
        NaN is not; ``reduce`` keeps a NaN flag apart)."""
        return b.select(b.fcmp_ordered(">", y, x), y, x)

    def reduce(self, name: str, fill: float, op: Any) -> None:
        """``name(x, n) -> float``: ``x[:n]`` reduced by ``op`` from ``fill``; for the
        max, NaN when any lane of any vector was NaN."""
        ir, c, L, A = self.ir, self.c, self.n, ACCUMULATORS
        fn = ir.Function(self.mod, ir.FunctionType(self.f32, [self.fp, self.i64]), name=name)
        x, n = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        vp = self.vf.as_pointer()
        start = ir.Constant(self.vf, [fill] * L)
        is_max = op == self.max_of
        no_nan = ir.Constant(self.vm, [0] * L)

        def at(i: Any) -> Any:
            return b.bitcast(b.gep(x, [i]), vp)

        def fold(accs: list[Any], v: Any, slot: int) -> list[Any]:
            out = list(accs)
            out[slot] = op(b, accs[slot], v)
            if is_max:
                out[A] = b.or_(accs[A], b.fcmp_unordered("uno", v, v))
            return out

        def group(i: Any, accs: list[Any]) -> list[Any]:
            for a in range(A):
                accs = fold(accs, b.load(at(b.add(i, c(a * L))), align=4), a)
            return accs

        def single(i: Any, accs: list[Any]) -> list[Any]:
            return fold(accs, b.load(at(i), align=4), 0)

        accs = [start] * A + ([no_nan] if is_max else [])
        whole_groups = b.mul(b.sdiv(n, c(A * L)), c(A * L))
        accs = carried_loop(b, c(0), whole_groups, A * L, accs, group)
        whole = b.mul(b.sdiv(n, c(L)), c(L))
        accs = carried_loop(b, whole_groups, whole, L, accs, single)
        mask = b.icmp_signed("<", self.iota, splat(b, b.trunc(b.sub(n, whole), self.i32), L))
        rest = b.call(self.mload, [at(whole), ir.Constant(self.i32, 4), mask, start])
        accs = fold(accs, rest, 0)
        parts = accs[:A]
        while len(parts) > 1:  # pairwise: (a0 + a1) + (a2 + a3)
            parts = [op(b, parts[q], parts[q + 1]) for q in range(0, len(parts), 2)]
        v, width = parts[0], L
        while width > 1:  # across the lanes: halves, then quarters, ...
            width //= 2
            lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(self.i32, width),
                                                    list(range(width))))  # fmt: skip
            hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(self.i32, width),
                                                    list(range(width, 2 * width))))  # fmt: skip
            v = op(b, lo, hi)
        got = b.extract_element(v, ir.Constant(self.i32, 0))
        if is_max:
            flags = b.bitcast(accs[A], ir.IntType(L))
            nan = b.icmp_unsigned("!=", flags, ir.Constant(ir.IntType(L), 0))
            got = b.select(nan, ir.Constant(self.f32, float("nan")), got)
        b.ret(got)


def _signatures(t: Any) -> list[tuple[str, Any]]:
    p, i = t.uintp, t.int64
    return [(SYMBOL_MAX, t.float32(p, i)), (SYMBOL_SUM, t.float32(p, i))]


#: the kernels and their numba wrappers, decided and built once per process
_KERNELS = WrappedKernels(
    build,
    _signatures,
    "float32",
    globals(),
    {"rowmax_f4": ("_rowmax_f4", "_max"), "rowsum_f4": ("_rowsum_f4", "_sum")},
)
_max: Any = None  # the ExternalFunctions the wrappers call (set before they compile)
_sum: Any = None


def kernels() -> tuple[Any, ...] | None:
    """The numba wrappers ``(rowmax_f4, rowsum_f4)`` (module docstring), None where the
    kernels are off."""
    return _KERNELS.get()


#: ``describe()``: how the kernels were decided ("" before they were); ``from ... import
#: rowmax_f4, rowsum_f4`` (the generated modules' form) builds them
describe = _KERNELS.describe
__getattr__ = _KERNELS.module_getattr(__name__)


def _rowmax_f4(x, xo, n):  # pragma: no cover - compiled
    return _max(x.ctypes.data + np.uint64(xo * 4), n)


def _rowsum_f4(x, xo, n):  # pragma: no cover - compiled
    return _sum(x.ctypes.data + np.uint64(xo * 4), n)
