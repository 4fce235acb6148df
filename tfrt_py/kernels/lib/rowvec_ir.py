"""A float32 row times a matrix of many rows, sums in registers: the LLVM IR kernel under a
decode step's attention output (its probabilities times the values of a KV cache,
``native/lower/ops_dec.rows_times_cache``).

``rowvec(a, k, b, n, y) -> 0``: ``y[j]`` = the sum over ``i < k`` of ``a[i] * b[i * n +
j]`` for ``j < n`` (``b`` row-major (k, n), rows contiguous). The columns go in blocks of
``VECTORS`` vectors (the last block's last vector masked: no read or write past a row),
each block's sums kept in registers over every row: ``partials`` accumulators a vector
(row ``i`` into partial ``i % partials``: independent fused multiply-add chains, so the
loop runs at the FMA pipes' rate instead of their latency), added pairwise at the end
(``(p0 + p1) + (p2 + p3)``). The sums round differently from a sequential sum, as BLAS's
do; NaN and infinities propagate.

What it replaces: the generated loop keeps the row of sums in memory (a load, two
multiply-adds and a store a pair of rows: a store-forwarding chain), 3-4x the time of
this loop at 513 rows of 32 or 64 (Zen 5).

``kernel()`` is the numba wrapper ``rowvec_f4(a, ao, b, bo, y, yo, k, n)`` (flat float32
arrays, element offsets; the caller checks the bounds), None where there is no llvmlite
JIT, no AVX2, ``$TFRT_PY_ISA=portable`` or the packed kernels are switched off; ``from
...rowvec_ir import rowvec_f4`` (the generated modules' form) builds it. Vectors of 16
floats with AVX-512F (4 partials), 8 with AVX2 (2 partials: sixteen registers), as
``pool_ir``'s widths. Built once per process under a lock (its machine code cached as the
packed gemms'); stateless; any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .gemm_packed import carried_loop, splat, wide_vectors
from .ir_kernels import FloatVectors, WrappedKernels, build_module
from .pool_ir import host_lanes, lanes

__all__ = ["SYMBOL", "VECTORS", "build", "describe", "host_lanes", "kernel", "lanes"]

SYMBOL = "tfrt_py_rowvec_f32"
#: vectors of columns a block keeps in registers (times its partial sums)
VECTORS = 4
#: rows of ``a`` a pass over ``b`` serves with AVX-512 (2 with AVX2: sixteen registers)
ROWS = 4


def build(n: int) -> Any:
    """The engine holding the kernel for vectors of ``n`` floats (one of ``host_lanes()``):
    for tests and benchmarks of a width apart from the process's. Raises what llvmlite
    raises."""
    return build_module(lambda: _RowVecIR(n).text(), f"rowvec_ir|{n}", __file__)


class _RowVecIR(FloatVectors):
    """The module: ``SYMBOL`` walking the column blocks, a function per block form (whole
    blocks of ``VECTORS`` vectors; a last block of 0..VECTORS-1 whole vectors and a masked
    one)."""

    def __init__(self, n: int) -> None:
        super().__init__(n, "tfrt_py_rowvec")
        self.partials = 4 if n == 16 else 2
        self.rows = ROWS if n == 16 else 2

    def text(self) -> str:
        cols = {r: self.columns(r, [self.block(VECTORS, False, r)]
                                + [self.block(w, True, r) for w in range(VECTORS)])
                for r in sorted({1, self.rows})}  # fmt: skip
        self.top(cols)
        text = str(self.mod)
        names = [f.name for f in self.mod.functions if not f.name.startswith("llvm.")]
        return wide_vectors(text, names) if self.n * 32 > 256 else text

    def top(self, cols: dict[int, Any]) -> None:
        """``SYMBOL(a, m, k, b, n, y)``: the rows of ``a`` ``self.rows`` at a time (each
        group over every column of ``b``, its rows read once for the group), the rows
        left one at a time."""
        ir, i64, c = self.ir, self.i64, self.c
        fn = ir.Function(self.mod, ir.FunctionType(i64, [self.fp, i64, i64, self.fp, i64,
                                                          self.fp]), name=SYMBOL)  # fmt: skip
        a, m, k, bm, n, y = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        R = self.rows
        grouped = b.mul(b.sdiv(m, c(R)), c(R))

        def rows(r: int) -> Any:
            def go(i: Any, _: list[Any]) -> list[Any]:
                b.call(cols[r], [b.gep(a, [b.mul(i, k)]), k, bm, n, b.gep(y, [b.mul(i, n)])])
                return []

            return go

        carried_loop(b, c(0), grouped, R, [], rows(R))
        carried_loop(b, grouped, m, 1, [], rows(1))
        b.ret(c(0))

    def columns(self, rows: int, blocks: list[Any]) -> Any:
        """``(a, k, b, n, y)`` for ``rows`` rows of ``a`` (stride ``k``) and of ``y``
        (stride ``n``): whole column blocks, then the last one by its form."""
        ir, i64, c, L = self.ir, self.i64, self.c, self.n
        fn = ir.Function(self.mod, ir.FunctionType(i64, [self.fp, i64, self.fp, i64, self.fp]),
                         name=f"{SYMBOL}_rows{rows}")  # fmt: skip
        a, k, bm, n, y = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        width = VECTORS * L
        whole = b.mul(b.sdiv(n, c(width)), c(width))

        def full(j0: Any, _: list[Any]) -> list[Any]:
            b.call(blocks[0], [a, k, b.gep(bm, [j0]), n, b.gep(y, [j0]), c(0)])
            return []

        carried_loop(b, c(0), whole, width, [], full)
        left = b.sub(n, whole)
        done = fn.append_basic_block()
        go = fn.append_basic_block()
        b.cbranch(b.icmp_signed(">", left, c(0)), go, done)
        b.position_at_end(go)
        sw = b.switch(b.sdiv(left, c(L)), done)
        for w in range(VECTORS):
            blk = fn.append_basic_block()
            sw.add_case(c(w), blk)
            b.position_at_end(blk)
            b.call(blocks[1 + w], [a, k, b.gep(bm, [whole]), n, b.gep(y, [whole]),
                                   b.sub(left, c(w * L))])  # fmt: skip
            b.branch(done)
        b.position_at_end(done)
        b.ret(c(0))
        return fn

    def block(self, whole: int, tail: bool, rows: int) -> Any:
        """``(a, k, b, n, y, rest)``: the columns of ``whole`` vectors (and with ``tail`` a
        last one of ``rest`` < lanes columns, masked) from ``b`` and ``y``, over every
        row of ``b``, for ``rows`` rows of ``a`` and ``y`` (strides ``k`` and ``n``): each
        row of ``b`` loaded once for all of them."""
        ir, i64, c, L = self.ir, self.i64, self.c, self.n
        name = f"{SYMBOL}_{rows}x{whole}{'m' if tail else ''}"
        fn = ir.Function(self.mod, ir.FunctionType(i64, [self.fp, i64, self.fp, i64, self.fp,
                                                          i64]), name=name)  # fmt: skip
        a, k, bm, n, y, rest = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        vp, four = self.vf.as_pointer(), ir.Constant(self.i32, 4)
        mask = b.icmp_signed("<", self.iota, splat(b, b.trunc(rest, self.i32), L))
        vecs = whole + (1 if tail else 0)
        R = rows
        P = self.partials if R == 1 else 1  # (R rows: R independent chains a vector)
        slot = lambda p, q, v: (p * R + q) * vecs + v  # noqa: E731

        def row_vectors(i: Any) -> list[Any]:
            row = b.gep(bm, [b.mul(i, n)])
            out = [b.load(b.bitcast(b.gep(row, [c(v * L)]), vp), align=4) for v in range(whole)]
            if tail:
                at = b.bitcast(b.gep(row, [c(whole * L)]), vp)
                out.append(b.call(self.mload, [at, four, mask, self.zero]))
            return out

        def step(i: Any, accs: list[Any], p: int, out: list[Any]) -> None:
            """Row ``i`` of ``b`` into partial ``p`` of every row of ``a``."""
            bvs = row_vectors(i)
            for q in range(R):
                av = splat(b, b.load(b.gep(a, [b.add(b.mul(c(q), k), i)]), align=4), L)
                for v, bv in enumerate(bvs):
                    out[slot(p, q, v)] = b.call(self.fma, [av, bv, accs[slot(p, q, v)]])

        def rows_of_b(i: Any, accs: list[Any]) -> list[Any]:  # row i + p into partial p
            out = list(accs)
            for p in range(P):
                step(b.add(i, c(p)), out, p, out)
            return out

        accs = [self.zero] * (P * R * vecs)
        groups = b.mul(b.sdiv(k, c(P)), c(P))
        accs = carried_loop(b, c(0), groups, P, accs, rows_of_b)

        def one(i: Any, accs: list[Any]) -> list[Any]:  # the rows left, into partial 0
            out = list(accs)
            step(i, out, 0, out)
            return out

        accs = carried_loop(b, groups, k, 1, accs, one)
        for q in range(R):
            for v in range(vecs):
                parts = [accs[slot(p, q, v)] for p in range(P)]
                while len(parts) > 1:  # pairwise: (p0 + p1) + (p2 + p3)
                    parts = [b.fadd(parts[t], parts[t + 1]) for t in range(0, len(parts), 2)]
                at = b.bitcast(b.gep(y, [b.add(b.mul(c(q), n), c(v * L))]), vp)
                if tail and v == whole:
                    b.call(self.mstore, [parts[0], at, four, mask])
                else:
                    b.store(parts[0], at, align=4)
        b.ret(c(0))
        return fn


def _signatures(t: Any) -> list[tuple[str, Any]]:
    p, i = t.uintp, t.int64
    return [(SYMBOL, t.int64(p, i, i, p, i, p))]


#: the kernel and its numba wrapper, decided and built once per process
_KERNELS = WrappedKernels(build, _signatures, "float32", globals(),
                          {"rowvec_f4": ("_rowvec_f4", "_ext")})  # fmt: skip
_ext: Any = None  # the ExternalFunction the wrapper calls (set before it compiles)


#: ``kernel()``: the numba wrapper ``rowvec_f4`` (module docstring), None where the kernel
#: is off; ``describe()``: how it was decided ("" before it was); ``from ... import
#: rowvec_f4`` (the generated modules' form) builds it
kernel = _KERNELS.first
describe = _KERNELS.describe
__getattr__ = _KERNELS.module_getattr(__name__)


def _rowvec_f4(a, ao, b, bo, y, yo, m, k, n):  # pragma: no cover - compiled
    _ext(a.ctypes.data + np.uint64(ao * 4), m, k, b.ctypes.data + np.uint64(bo * 4), n,
         y.ctypes.data + np.uint64(yo * 4))  # fmt: skip
