"""A linear model's sums over many rows: the LLVM IR kernel under a LinearClassifier's rows
on the native tier (``native/kernels/linear_ir``), vectors of rows in registers.

``rows(x, m, f, w, n, s) -> 0``: for each of ``m`` float32 rows of ``x`` (``f`` features,
C-contiguous) and each of ``n`` classes, ``s[r * n + j]`` = the sum over ``i`` of ``x[r *
f + i] * w[i * n + j]`` (``w`` row-major (f, n)), as a chain of fused multiply-adds from
0 in feature order -- the bits of ``native/kernels/svm.linear_cls_row``'s sums in a
generated module (which contracts them), so a row's scores do not depend on the rows
around it or on the path.

What the numba loop cannot do: lanes over rows, the sums in registers. A pass takes two
vectors of rows (two independent chains per class hide the multiply-add's latency) and
classes ``CLASSES`` at a time; its rows' features, ``FEATURES`` at a time, are loaded a
row a vector (masked past the row and past ``m``: no scalar tail, no read past the input)
and transposed by shuffles into a stack block of a vector per feature (a strided gather is
about twice as slow on Zen 5); then one multiply-add per feature, half and class by the
weight broadcast. A whole pass of every class leaves as ``k`` vectors a half, its sums
interleaved into rows by shuffles; other passes row by row. LinearSVC (20 features, 3
classes) at 1,000 rows: the native call 13.2 -> 6.8 µs (numba's 8-row loop kept its sums
in memory, a store-forwarding chain per feature; Zen 5, one thread).

``kernel()`` is the numba ExternalFunction (pointers as integers), None where there is no
llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable`` or the packed kernels are switched off.
Vectors of 16 rows with AVX-512F (``$TFRT_PY_ISA`` permitting), 8 with AVX2 (``pool_ir``'s
widths). Built once per process under a lock (its machine code cached as the packed
gemms'); stateless; any thread.
"""

from __future__ import annotations

from typing import Any

from ...concurrency import compiled_gate
from ...concurrency.env_switch import switched_off
from ...concurrency.once import Once
from .gemm_packed import ENV_PACKED_GEMM, carried_loop, splat, wide_vectors
from .ir_kernels import FloatVectors, build_module
from .pool_ir import host_lanes, lanes, register_lanes

__all__ = ["CLASSES", "FEATURES", "MAX_CLASSES", "ROWS", "SYMBOL", "build", "describe",
           "host_lanes", "kernel", "lanes"]  # fmt: skip

SYMBOL = "tfrt_py_linear_rows_f32"
#: rows the native tier's caller sums a call (its scratch: ``ROWS * n`` floats)
ROWS = 64
#: the most classes the native tier's caller takes here (its scratch at most 1 MB; a model
#: of more keeps the numba loop's eight rows of scratch)
MAX_CLASSES = 4096
#: classes a pass keeps in registers (two accumulators each)
CLASSES = 4
#: features a pass transposes at a time (its stack block: ``FEATURES * 2 * lanes`` floats)
FEATURES = 64


def build(n: int) -> Any:
    """The engine holding the kernel for vectors of ``n`` rows (one of ``host_lanes()``):
    for tests and benchmarks of a width apart from the process's. Raises what llvmlite
    raises."""
    return build_module(lambda: _RowsIR(n).text(), f"linear_rows_ir|{n}", __file__)


class _RowsIR(FloatVectors):
    """The module: ``SYMBOL`` looping over passes of ``2 * n`` rows and, in each, over
    chunks of at most ``CLASSES`` classes, dispatching each chunk to the function for its
    width (one per width 1..CLASSES)."""

    def __init__(self, n: int) -> None:
        super().__init__(n, "tfrt_py_linear_rows")

    def text(self) -> str:
        chunks = [self.chunk(k) for k in range(1, CLASSES + 1)]
        self.top(chunks)
        text = str(self.mod)
        names = [SYMBOL] + [fn.name for fn in chunks]
        return wide_vectors(text, names) if self.n * 32 > 256 else text

    def top(self, chunks: list[Any]) -> None:
        """``SYMBOL(x, m, f, w, n, s)``: passes of ``2 * lanes`` rows, each over the class
        chunks."""
        ir, i64, c = self.ir, self.i64, self.c
        fn = ir.Function(self.mod, ir.FunctionType(i64, [self.fp, i64, i64, self.fp, i64,
                                                          self.fp]), name=SYMBOL)  # fmt: skip
        x, m, f, w, n, s = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        rows_a_pass = 2 * self.n

        def pass_(r0: Any, _: list[Any]) -> list[Any]:
            left = b.sub(m, r0)
            left = b.select(b.icmp_signed(">", left, c(rows_a_pass)), c(rows_a_pass), left)
            xp = b.gep(x, [b.mul(r0, f)])
            sp = b.gep(s, [b.mul(r0, n)])

            def chunk(j0: Any, _: list[Any]) -> list[Any]:
                width = b.sub(n, j0)
                width = b.select(b.icmp_signed(">", width, c(CLASSES)), c(CLASSES), width)
                done = fn.append_basic_block()
                sw = b.switch(width, done)
                for k, target in enumerate(chunks, 1):
                    blk = fn.append_basic_block()
                    sw.add_case(c(k), blk)
                    b.position_at_end(blk)
                    b.call(target, [xp, left, f, w, n, j0, sp])
                    b.branch(done)
                b.position_at_end(done)
                return []

            carried_loop(b, c(0), n, CLASSES, [], chunk)
            return []

        carried_loop(b, c(0), m, rows_a_pass, [], pass_)
        b.ret(c(0))

    def transpose(self, b: Any, vs: list[Any]) -> list[Any]:
        """The ``n`` x ``n`` block of vectors ``vs`` (a row each) as its columns, as x86
        code transposes: pairs of floats, then of pairs, interleaved within 128-bit lanes
        (``unpcklps``/``unpckhps``, ``unpcklpd``/``unpckhpd``: cheap in-lane shuffles), then
        128-bit lanes exchanged (``vshuff32x4`` 0x88/0xdd twice; AVX2: ``vperm2f128``)."""
        ir, L = self.ir, self.n

        def lanes(f: Any) -> list[int]:
            return [v for lane in range(L // 4) for v in f(4 * lane)]

        def sh(a: Any, c: Any, idx: list[int]) -> Any:
            return b.shuffle_vector(a, c, ir.Constant(self.vi, idx))

        def quads(picks: list[tuple[int, int]]) -> list[int]:  # (source, 128-bit lane)
            return [src * L + 4 * q + e for src, q in picks for e in range(4)]

        ulo = lanes(lambda o: [o, L + o, o + 1, L + o + 1])
        uhi = lanes(lambda o: [o + 2, L + o + 2, o + 3, L + o + 3])
        dlo = lanes(lambda o: [o, o + 1, L + o, L + o + 1])
        dhi = lanes(lambda o: [o + 2, o + 3, L + o + 2, L + o + 3])
        t: list[Any] = []
        for i in range(0, L, 2):
            t += [sh(vs[i], vs[i + 1], ulo), sh(vs[i], vs[i + 1], uhi)]
        r: list[Any] = []
        for g in range(0, L, 4):
            r += [sh(t[g], t[g + 2], dlo), sh(t[g], t[g + 2], dhi),
                  sh(t[g + 1], t[g + 3], dlo), sh(t[g + 1], t[g + 3], dhi)]  # fmt: skip
        if L == 8:
            lo, hi = quads([(0, 0), (1, 0)]), quads([(0, 1), (1, 1)])
            return [sh(r[i], r[i + 4], lo) for i in range(4)] + [
                sh(r[i], r[i + 4], hi) for i in range(4)]  # fmt: skip
        even, odd = quads([(0, 0), (0, 2), (1, 0), (1, 2)]), quads([(0, 1), (0, 3), (1, 1), (1, 3)])
        u: list[Any] = [None] * L
        for g in (0, 8):
            for i in range(4):
                u[g + i] = sh(r[g + i], r[g + i + 4], even)
                u[g + i + 4] = sh(r[g + i], r[g + i + 4], odd)
        return [sh(u[i], u[i + 8], even) for i in range(8)] + [
            sh(u[i], u[i + 8], odd) for i in range(8)]  # fmt: skip

    def chunk(self, k: int) -> Any:
        """``(x, rows, f, w, n, j0, s)``: classes ``j0 .. j0 + k`` of ``rows`` (at most
        ``2 * lanes``) rows from ``x``, their sums written at ``s[r * n + j]``. The rows'
        features ``FEATURES`` at a time: transposed into a stack block (a vector per
        feature and half of the rows: masked row loads, then ``transpose`` per ``lanes``
        features), then one multiply-add per feature, half and class."""
        ir, i64, c, L = self.ir, self.i64, self.c, self.n
        fn = ir.Function(self.mod, ir.FunctionType(i64, [self.fp, i64, i64, self.fp, i64, i64,
                                                          self.fp]),
                         name=f"{SYMBOL}_{k}")  # fmt: skip
        x, rows, f, w, n, j0, s = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        xt = b.bitcast(b.alloca(ir.ArrayType(self.f32, FEATURES * 2 * L)), self.fp)
        tmp = b.bitcast(b.alloca(ir.ArrayType(self.f32, 2 * k * L)), self.fp)
        vp, four = self.vf.as_pointer(), ir.Constant(self.i32, 4)
        rows32 = b.trunc(rows, self.i32)

        def vec_at(p: Any, at: Any) -> Any:
            return b.bitcast(b.gep(p, [at]), vp)

        def features(i0: Any, accs: list[Any]) -> list[Any]:
            nf = b.sub(f, i0)
            nf = b.select(b.icmp_signed(">", nf, c(FEATURES)), c(FEATURES), nf)

            def tile(t0: Any, _: list[Any]) -> list[Any]:
                left = splat(b, b.trunc(b.sub(nf, t0), self.i32), self.n)
                cols = b.icmp_signed("<", self.iota, left)
                for h in range(2):
                    vs = []
                    for q in range(L):
                        row = ir.Constant(self.i32, h * L + q)
                        ok = b.and_(cols, splat(b, b.icmp_signed("<", row, rows32), L))
                        at = b.add(b.mul(c(h * L + q), f), b.add(i0, t0))
                        vs.append(b.call(self.mload, [vec_at(x, at), four, ok, self.zero]))
                    for t, col in enumerate(self.transpose(b, vs)):
                        at = b.add(b.mul(b.add(t0, c(t)), c(2 * L)), c(h * L))
                        b.store(col, vec_at(xt, at), align=4)
                return []

            carried_loop(b, c(0), nf, L, [], tile)

            def feature(i: Any, accs: list[Any]) -> list[Any]:
                xa = b.load(vec_at(xt, b.mul(i, c(2 * L))), align=4)
                xb = b.load(vec_at(xt, b.add(b.mul(i, c(2 * L)), c(L))), align=4)
                wrow = b.gep(w, [b.add(b.mul(b.add(i0, i), n), j0)])
                out = list(accs)
                for jj in range(k):
                    wv = splat(b, b.load(b.gep(wrow, [c(jj)]), align=4), self.n)
                    out[jj] = b.call(self.fma, [xa, wv, accs[jj]])
                    out[k + jj] = b.call(self.fma, [xb, wv, accs[k + jj]])
                return out

            return carried_loop(b, c(0), nf, 1, accs, feature)

        accs = carried_loop(b, c(0), f, FEATURES, [self.zero] * (2 * k), features)
        # out: a whole pass of every class is 2 * lanes rows of k floats, one after another:
        # the accumulators interleaved by shuffles and stored as k vectors a half; else
        # through a stack block, row by row
        whole = b.and_(b.icmp_signed("==", rows, c(2 * L)), b.icmp_signed("==", n, c(k)))
        fast, slow, done = (fn.append_basic_block() for _ in range(3))
        b.cbranch(whole, fast, slow)
        b.position_at_end(fast)
        for h in range(2):
            for o, v in enumerate(self.interleaved(b, accs[h * k : (h + 1) * k])):
                b.store(v, vec_at(s, c((h * k + o) * L)), align=4)
        b.branch(done)
        b.position_at_end(slow)
        for h in range(2):
            for jj in range(k):
                b.store(accs[h * k + jj], vec_at(tmp, c((jj * 2 + h) * L)), align=4)

        def out_row(q: Any, _: list[Any]) -> list[Any]:
            h, lane = b.udiv(q, c(L)), b.urem(q, c(L))
            row = b.gep(s, [b.add(b.mul(q, n), j0)])
            for jj in range(k):
                v = b.load(b.gep(tmp, [b.add(b.mul(b.add(c(jj * 2), h), c(L)), lane)]), align=4)
                b.store(v, b.gep(row, [c(jj)]), align=4)
            return []

        carried_loop(b, c(0), rows, 1, [], out_row)
        b.branch(done)
        b.position_at_end(done)
        b.ret(c(0))
        return fn

    def interleaved(self, b: Any, vs: list[Any]) -> list[Any]:
        """``k`` vectors (a class each, a row a lane) as ``k`` vectors of the rows' classes
        one after another: output lane ``e`` of vector ``o`` is ``vs[(o * lanes + e) % k]``'s
        lane ``(o * lanes + e) // k``, gathered by a chain of two-source shuffles (``k - 1`` a
        vector)."""
        ir, L, k = self.ir, self.n, len(vs)
        if k == 1:
            return list(vs)
        out = []
        for o in range(k):
            src = [((o * L + e) % k, (o * L + e) // k) for e in range(L)]
            v = vs[0]
            for j in range(1, k):  # lanes from class j replace; those of classes < j stay
                idx = [L + lane if cls == j else (e if j > 1 else lane if cls == 0 else 0)
                       for e, (cls, lane) in enumerate(src)]  # fmt: skip
                v = b.shuffle_vector(v, vs[j], ir.Constant(self.vi, idx))
            out.append(v)
        return out


def _signatures(t: Any) -> list[tuple[str, Any]]:
    p, i = t.uintp, t.int64
    return [(SYMBOL, t.int64(p, i, i, p, i, p))]


#: (why, (the ExternalFunction,) or None, engine or None), decided on first use
_DECIDED: Once[tuple[str, Any, Any]] = Once(lambda: register_lanes(build, _signatures, "rows"))


def kernel() -> Any:
    """The ExternalFunction (module docstring), None where the kernel is off."""
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return None
    fns = _DECIDED.get()[1]
    return None if fns is None else fns[0]


def describe() -> str:
    """How the kernel was decided ("" before it was)."""
    got = _DECIDED.peek()
    return got[0] if got else ""
