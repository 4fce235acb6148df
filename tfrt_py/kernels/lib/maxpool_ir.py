"""A float32 3x3 stride-2 MaxPool over whole planes: the LLVM IR kernel under
``nn/pool_direct`` for ResNet's, SqueezeNet's, ShuffleNet's and GoogLeNet's pools.

``pool(x, y, planes, h, w, oh, ow, pt, pl)``: for each of ``planes`` C-contiguous planes
(``x``: ``h`` x ``w``, ``y``: ``oh`` x ``ow``, one after another), ``y[r, j]`` = the max
of ``x`` over rows ``2r - pt .. 2r - pt + 2`` and columns ``2j - pl .. 2j - pl + 2`` that
lie inside the plane (padding never wins; a window whose columns are all outside gives
-inf). Every output row's window must hold a row of the plane (``0 <= 2r - pt + 2`` and
``2r - pt <= h - 1``: the caller's condition). NaN propagates as with ``np.maximum``: the
arithmetic is ``pool_direct._mx``'s, rows first, then columns, in the numba loops' order,
so the two give the same bits.

What the numba loops cannot express: per vector of ``lanes`` outputs, the vertical maxima
of ``2 * lanes`` input columns (two vectors, the second carried to the next block as its
first) are split into their even and odd columns by two shuffles, so each output is three
vector maxima of values already in registers -- no stride-2 reads, no pass over a
temporary. The window's rows are clamped into the plane (a row counted twice does not
change a max); columns outside it are masked loads that read -inf (no fault past either
end of a row or of the buffer).

``kernel()`` is the numba ExternalFunction (pointers as integers, status 0), None where
there is no llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable`` or the packed kernels are
switched off. Vectors of 16 outputs with AVX-512F (``$TFRT_PY_ISA`` permitting), 8 with
AVX2. Built once per process under a lock (its machine code cached as the packed gemms');
stateless; any thread.
"""

from __future__ import annotations

import os
from typing import Any

from ...concurrency import compiled_gate
from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from .gemm_packed import ENV_ISA, ENV_PACKED_GEMM, counted_loop, wide_vectors

__all__ = ["SYMBOL", "build", "describe", "host_lanes", "kernel", "lanes"]

SYMBOL = "tfrt_py_maxpool_3x3s2_f32"


def host_lanes() -> list[int]:
    """Every vector width this host runs, widest first: 16 and 8 with AVX-512F, 8 with
    AVX2; none elsewhere."""
    import llvmlite.binding as llvm

    if not llvm.get_process_triple().startswith("x86_64"):
        return []
    f = llvm.get_host_cpu_features()
    if not f.get("avx2"):
        return []
    return [16, 8] if f.get("avx512f") else [8]


def lanes() -> int:
    """The width this process uses: the host's widest, 8 with ``$TFRT_PY_ISA=avx2``, 0
    with ``$TFRT_PY_ISA=portable`` or where the host has none."""
    forms = host_lanes()
    isa = os.environ.get(ENV_ISA, "").strip().lower()
    if isa == "portable" or not forms:
        return 0
    return forms[-1] if isa == "avx2" else forms[0]


def build(n: int) -> Any:
    """The engine holding the kernel for vectors of ``n`` outputs (one of
    ``host_lanes()``): for tests and benchmarks of a width apart from the process's.
    Raises what llvmlite raises."""
    return compile_ir_cached(lambda: _PoolIR(n).text(), f"maxpool_ir|{n}", (__file__,), opt=3)[0]


class _PoolIR:
    """The module: ``SYMBOL`` for vectors of ``n`` float32 outputs."""

    def __init__(self, n: int) -> None:
        import llvmlite.ir as ir

        self.ir, self.n = ir, n
        self.i1, self.i32, self.i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
        self.f32 = ir.FloatType()
        self.vf = ir.VectorType(self.f32, n)
        self.vi = ir.VectorType(self.i32, n)
        self.mod = ir.Module(name="tfrt_py_maxpool")
        vp, vm = self.vf.as_pointer(), ir.VectorType(self.i1, n)
        self.mload = ir.Function(self.mod, ir.FunctionType(self.vf, [vp, self.i32, vm, self.vf]),
                                 name=f"llvm.masked.load.v{n}f32.p0v{n}f32")  # fmt: skip
        store_t = ir.FunctionType(ir.VoidType(), [self.vf, vp, self.i32, vm])
        self.mstore = ir.Function(self.mod, store_t, name=f"llvm.masked.store.v{n}f32.p0v{n}f32")
        self.ninf = ir.Constant(self.vf, [float("-inf")] * n)
        self.nan = ir.Constant(self.vf, [float("nan")] * n)
        i8p = ir.IntType(8).as_pointer()
        pf_t = ir.FunctionType(ir.VoidType(), [i8p, *[self.i32] * 3])
        self.prefetch = ir.Function(self.mod, pf_t, name="llvm.prefetch.p0i8")
        self.iota = ir.Constant(self.vi, list(range(n)))

    def c(self, v: int) -> Any:
        return self.ir.Constant(self.i64, v)

    def text(self) -> str:
        self.function()
        text = str(self.mod)
        return wide_vectors(text, [SYMBOL]) if self.n * 32 > 256 else text

    def splat(self, value: Any) -> Any:
        b, ir = self.b, self.ir
        e = b.insert_element(ir.Constant(self.vi, ir.Undefined), value, ir.Constant(self.i32, 0))
        zeros = ir.Constant(ir.VectorType(self.i32, self.n), [0] * self.n)
        return b.shuffle_vector(e, ir.Constant(self.vi, ir.Undefined), zeros)

    def max3(self, a: Any, v: Any, u: Any) -> Any:
        """``_mx(_mx(a, v), u)``: the larger, the first of equals; NaN where any is NaN."""
        b = self.b
        m = b.select(b.fcmp_ordered(">", v, a), v, a)
        m = b.select(b.fcmp_ordered(">", u, m), u, m)
        nan = b.or_(b.fcmp_unordered("uno", a, v), b.fcmp_unordered("uno", u, u))
        return b.select(nan, self.nan, m)

    def rows_max(self, rows: list[Any], col: Any, w: Any | None) -> Any:
        """The max over ``rows`` (pointers) of the ``n`` columns from ``col``; with ``w``,
        -inf where a column is outside ``[0, w)`` (masked loads), else all inside."""
        b, ir = self.b, self.ir
        vp, four = self.vf.as_pointer(), ir.Constant(self.i32, 4)
        ptrs = [b.bitcast(b.gep(r, [col]), vp) for r in rows]
        if w is None:
            got = [b.load(p, align=4) for p in ptrs]
        else:
            at = b.add(self.splat(b.trunc(col, self.i32)), self.iota)
            inside = b.and_(b.icmp_signed(">=", at, ir.Constant(self.vi, [0] * self.n)),
                            b.icmp_signed("<", at, self.splat(b.trunc(w, self.i32))))  # fmt: skip
            got = [b.call(self.mload, [p, four, inside, self.ninf]) for p in ptrs]
        return self.max3(*got)

    def function(self) -> None:
        ir, i64 = self.ir, self.i64
        fp = self.f32.as_pointer()
        fn = ir.Function(self.mod, ir.FunctionType(i64, [fp, fp, *[i64] * 7]), name=SYMBOL)
        fn.args[0].add_attribute("noalias")
        fn.args[1].add_attribute("noalias")
        self.b = b = ir.IRBuilder(fn.append_basic_block("entry"))
        x, y, planes, h, w, oh, ow, pt, pl = fn.args
        in_plane, out_plane = b.mul(h, w), b.mul(oh, ow)

        def plane(p: Any) -> None:
            xp, yp = b.gep(x, [b.mul(p, in_plane)]), b.gep(y, [b.mul(p, out_plane)])
            counted_loop(b, self.c(0), oh, 1, lambda r: self.row(xp, yp, r, h, w, ow, pt, pl),
                         whole=False)  # fmt: skip

        counted_loop(b, self.c(0), planes, 1, plane, whole=False)
        b.ret(self.c(0))

    def row(self, xp: Any, yp: Any, r: Any, h: Any, w: Any, ow: Any, pt: Any, pl: Any) -> None:
        """Output row ``r``: blocks of ``n`` outputs, each from the vertical maxima of
        ``2n`` columns (``lo``, carried from the block before, and ``hi``) and the first
        of the next block's (``nxt``)."""
        ir, b, c, n = self.ir, self.b, self.c, self.n
        i8p = ir.IntType(8).as_pointer()
        top = b.sub(b.mul(r, c(2)), pt)
        last = b.sub(h, c(1))
        rows = []
        for i in range(3):  # clamped into the plane: the window's rows, one maybe twice
            k = b.add(top, c(i))
            k = b.select(b.icmp_signed("<", k, c(0)), c(0), k)
            k = b.select(b.icmp_signed(">", k, last), last, k)
            rows.append(b.gep(xp, [b.mul(k, w)]))
        # the next output row's two new input rows (past the plane's end: the last row)
        ahead = []
        for i in (3, 4):
            k = b.add(top, c(i))
            k = b.select(b.icmp_signed(">", k, last), last, k)
            k = b.select(b.icmp_signed("<", k, c(0)), c(0), k)
            ahead.append(b.gep(xp, [b.mul(k, w)]))
        yr = b.gep(yp, [b.mul(r, ow)])
        col0 = b.sub(c(0), pl)
        first = self.rows_max(rows, col0, w)
        pre = b.block
        head, body, after = (b.function.append_basic_block() for _ in range(3))
        b.branch(head)
        b.position_at_end(head)
        j, lo, col = b.phi(self.i64), b.phi(self.vf), b.phi(self.i64)
        j.add_incoming(c(0), pre)
        lo.add_incoming(first, pre)
        col.add_incoming(col0, pre)
        b.cbranch(b.icmp_signed("<", j, ow), body, after)
        b.position_at_end(body)
        # the next 2n columns: plain loads where all lie inside the row, else masked
        end = b.add(col, c(3 * n))
        inside = b.and_(b.icmp_signed(">=", col, c(0)), b.icmp_signed("<=", end, w))
        fast, slow, join = (b.function.append_basic_block() for _ in range(3))
        b.cbranch(inside, fast, slow)
        got = []
        for blk, bound in ((fast, None), (slow, w)):
            b.position_at_end(blk)
            if bound is None:  # rows 2r+3, 2r+4 for the next output row: short row streams
                for a in ahead:  # the hardware prefetcher leaves to memory at large planes
                    for q in range(0, 2 * n, 16):
                        at = b.bitcast(b.gep(a, [b.add(col, c(2 * n + q))]), i8p)
                        b.call(self.prefetch, [at, *(ir.Constant(self.i32, v) for v in (0, 3, 1))])
            pair = (self.rows_max(rows, b.add(col, c(n)), bound),
                    self.rows_max(rows, b.add(col, c(2 * n)), bound))  # fmt: skip
            got.append((pair, b.block))
            b.branch(join)
        b.position_at_end(join)
        hi, nxt = b.phi(self.vf), b.phi(self.vf)
        for (h_, x_), blk in got:
            hi.add_incoming(h_, blk)
            nxt.add_incoming(x_, blk)
        idx = ir.VectorType(self.i32, n)
        even = b.shuffle_vector(lo, hi, ir.Constant(idx, list(range(0, 2 * n, 2))))
        odd = b.shuffle_vector(lo, hi, ir.Constant(idx, list(range(1, 2 * n, 2))))
        right = b.shuffle_vector(even, nxt, ir.Constant(idx, list(range(1, n + 1))))
        out = self.max3(even, odd, right)
        lane = b.add(self.splat(b.trunc(j, self.i32)), self.iota)
        keep = b.icmp_signed("<", lane, self.splat(b.trunc(ow, self.i32)))
        ptr = b.bitcast(b.gep(yr, [j]), self.vf.as_pointer())
        b.call(self.mstore, [out, ptr, ir.Constant(self.i32, 4), keep])
        j.add_incoming(b.add(j, c(n)), b.block)
        lo.add_incoming(nxt, b.block)
        col.add_incoming(b.add(col, c(2 * n)), b.block)
        b.branch(head)
        b.position_at_end(after)


def _register() -> tuple[str, Any, Any]:
    try:
        from numba import types

        n = lanes()
        if not n:
            return "no AVX2 (or $TFRT_PY_ISA=portable)", None, None
        engine = build(n)
        add_symbol(SYMBOL, engine.get_function_address(SYMBOL))
        p, i = types.uintp, types.int64
        fn = types.ExternalFunction(SYMBOL, types.int64(p, p, i, i, i, i, i, i, i))
    except Exception as e:  # noqa: BLE001 - no llvmlite JIT here: the numba loop stays
        return f"the kernel did not build: {type(e).__name__}", None, None
    return f"vectors of {n} float32", fn, engine


#: (why, ExternalFunction or None, engine or None), decided on first use
_DECIDED: Once[tuple[str, Any, Any]] = Once(_register)


def kernel() -> Any:
    """The ExternalFunction (module docstring), None where the kernel is off."""
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return None
    return _DECIDED.get()[1]


def describe() -> str:
    """How the kernel was decided ("" before it was)."""
    got = _DECIDED.peek()
    return got[0] if got else ""
