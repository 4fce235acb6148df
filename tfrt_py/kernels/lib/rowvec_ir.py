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

import threading
from typing import Any

import numpy as np

from ...concurrency import compiled_gate, numba_target
from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import compile_ir_cached
from ...concurrency.once import Once
from .gemm_packed import ENV_PACKED_GEMM, carried_loop, splat, wide_vectors
from .pool_ir import host_lanes, lanes, register_lanes

__all__ = ["SYMBOL", "VECTORS", "build", "describe", "host_lanes", "kernel", "lanes"]

SYMBOL = "tfrt_py_rowvec_f32"
#: vectors of columns a block keeps in registers (times its partial sums)
VECTORS = 4


def build(n: int) -> Any:
    """The engine holding the kernel for vectors of ``n`` floats (one of ``host_lanes()``):
    for tests and benchmarks of a width apart from the process's. Raises what llvmlite
    raises."""
    return compile_ir_cached(lambda: _RowVecIR(n).text(), f"rowvec_ir|{n}", (__file__,),
                             opt=3)[0]  # fmt: skip


class _RowVecIR:
    """The module: ``SYMBOL`` walking the column blocks, a function per block form (whole
    blocks of ``VECTORS`` vectors; a last block of 0..VECTORS-1 whole vectors and a masked
    one)."""

    def __init__(self, n: int) -> None:
        import llvmlite.ir as ir

        self.ir, self.n = ir, n
        self.partials = 4 if n == 16 else 2
        self.i1, self.i32, self.i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
        self.f32 = ir.FloatType()
        self.fp = self.f32.as_pointer()
        self.vf = ir.VectorType(self.f32, n)
        self.vi = ir.VectorType(self.i32, n)
        self.vm = ir.VectorType(self.i1, n)
        self.mod = ir.Module(name="tfrt_py_rowvec")
        vp = self.vf.as_pointer()
        load_t = ir.FunctionType(self.vf, [vp, self.i32, self.vm, self.vf])
        self.mload = ir.Function(self.mod, load_t, name=f"llvm.masked.load.v{n}f32.p0v{n}f32")
        store_t = ir.FunctionType(ir.VoidType(), [self.vf, vp, self.i32, self.vm])
        self.mstore = ir.Function(self.mod, store_t, name=f"llvm.masked.store.v{n}f32.p0v{n}f32")
        self.fma = ir.Function(self.mod, ir.FunctionType(self.vf, [self.vf] * 3),
                               name=f"llvm.fma.v{n}f32")  # fmt: skip
        self.zero = ir.Constant(self.vf, [0.0] * n)
        self.iota = ir.Constant(self.vi, list(range(n)))

    def c(self, v: int) -> Any:
        return self.ir.Constant(self.i64, v)

    def text(self) -> str:
        blocks = [self.block(VECTORS, False)] + [self.block(w, True) for w in range(VECTORS)]
        self.top(blocks)
        names = [SYMBOL] + [fn.name for fn in blocks]
        text = str(self.mod)
        return wide_vectors(text, names) if self.n * 32 > 256 else text

    def top(self, blocks: list[Any]) -> None:
        """``SYMBOL(a, k, b, n, y)``: whole blocks, then the last one by its form."""
        ir, i64, c, L = self.ir, self.i64, self.c, self.n
        fn = ir.Function(self.mod, ir.FunctionType(i64, [self.fp, i64, self.fp, i64, self.fp]),
                         name=SYMBOL)  # fmt: skip
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

    def block(self, whole: int, tail: bool) -> Any:
        """``(a, k, b, n, y, rest)``: the columns of ``whole`` vectors (and with ``tail`` a
        last one of ``rest`` < lanes columns, masked) from ``b`` and ``y``, over every
        row."""
        ir, i64, c, L = self.ir, self.i64, self.c, self.n
        name = f"{SYMBOL}_{whole}{'m' if tail else ''}"
        fn = ir.Function(self.mod, ir.FunctionType(i64, [self.fp, i64, self.fp, i64, self.fp,
                                                          i64]), name=name)  # fmt: skip
        a, k, bm, n, y, rest = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        vp, four = self.vf.as_pointer(), ir.Constant(self.i32, 4)
        mask = b.icmp_signed("<", self.iota, splat(b, b.trunc(rest, self.i32), L))
        vecs = whole + (1 if tail else 0)
        P = self.partials

        def row_vectors(i: Any) -> list[Any]:
            row = b.gep(bm, [b.mul(i, n)])
            out = [b.load(b.bitcast(b.gep(row, [c(v * L)]), vp), align=4) for v in range(whole)]
            if tail:
                at = b.bitcast(b.gep(row, [c(whole * L)]), vp)
                out.append(b.call(self.mload, [at, four, mask, self.zero]))
            return out

        def rows(i: Any, accs: list[Any]) -> list[Any]:  # P rows: row i + p into partial p
            out = list(accs)
            for p in range(P):
                r = b.add(i, c(p))
                av = splat(b, b.load(b.gep(a, [r]), align=4), L)
                for v, bv in enumerate(row_vectors(r)):
                    out[p * vecs + v] = b.call(self.fma, [av, bv, out[p * vecs + v]])
            return out

        accs = [self.zero] * (P * vecs)
        groups = b.mul(b.sdiv(k, c(P)), c(P))
        accs = carried_loop(b, c(0), groups, P, accs, rows)

        def one(i: Any, accs: list[Any]) -> list[Any]:  # the rows left, into partial 0
            av = splat(b, b.load(b.gep(a, [i]), align=4), L)
            out = list(accs)
            for v, bv in enumerate(row_vectors(i)):
                out[v] = b.call(self.fma, [av, bv, out[v]])
            return out

        accs = carried_loop(b, groups, k, 1, accs, one)
        for v in range(vecs):
            parts = [accs[p * vecs + v] for p in range(P)]
            while len(parts) > 1:  # pairwise: (p0 + p1) + (p2 + p3)
                parts = [b.fadd(parts[q], parts[q + 1]) for q in range(0, len(parts), 2)]
            at = b.bitcast(b.gep(y, [c(v * L)]), vp)
            if tail and v == whole:
                b.call(self.mstore, [parts[0], at, four, mask])
            else:
                b.store(parts[0], at, align=4)
        b.ret(c(0))
        return fn


def _signatures(t: Any) -> list[tuple[str, Any]]:
    p, i = t.uintp, t.int64
    return [(SYMBOL, t.int64(p, i, p, i, p))]


#: (why, (the ExternalFunction,) or None, engine or None), decided on first use
_DECIDED: Once[tuple[str, Any, Any]] = Once(lambda: register_lanes(build, _signatures, "float32"))
_LOCK = threading.Lock()
_WRAPPED: list[Any] = []  # [the numba wrapper] once built
_ext: Any = None  # the ExternalFunction the wrapper calls (set before it compiles)


def kernel() -> Any:
    """The numba wrapper ``rowvec_f4`` (module docstring), None where the kernel is off."""
    global _ext
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return None
    fns = _DECIDED.get()[1]
    if fns is None:
        return None
    with _LOCK:
        if not _WRAPPED:
            _ext = fns[0]
            numba = numba_target.import_numba()
            _WRAPPED.append(numba.njit(nogil=True, cache=True)(_rowvec_f4))
        return _WRAPPED[0]


def describe() -> str:
    """How the kernel was decided ("" before it was)."""
    got = _DECIDED.peek()
    return got[0] if got else ""


def __getattr__(name: str) -> Any:
    """``rowvec_f4``: ``kernel()``, for ``from ...rowvec_ir import rowvec_f4``."""
    if name == "rowvec_f4":
        fn = kernel()
        if fn is not None:
            return fn
        raise AttributeError("the row-times-matrix kernel cannot run on this host")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rowvec_f4(a, ao, b, bo, y, yo, k, n):  # pragma: no cover - compiled
    _ext(a.ctypes.data + np.uint64(ao * 4), k, b.ctypes.data + np.uint64(bo * 4), n,
         y.ctypes.data + np.uint64(yo * 4))  # fmt: skip
