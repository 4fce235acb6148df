"""Float32 2-D MaxPool and AveragePool over whole planes for the common windows: the LLVM
IR kernels under ``nn/pool_direct`` and ``nn/pool_avg`` for 3x3 stride 2 (ResNet,
SqueezeNet, ShuffleNet, GoogLeNet), 2x2 stride 2 (VGG, U-Net, YOLO's tiny backbones,
DenseNet's transitions) and the stride-1 windows of Inception's branches and YOLO's
spatial pyramids (3x3, 5x5, 9x9, 13x13).

``pool(x, y, planes, h, w, oh, ow, pt, pl, window)``: for each of ``planes`` C-contiguous
planes (``x``: ``h`` x ``w``, ``y``: ``oh`` x ``ow``, one after another), ``y[r, j]`` =
the max of ``x`` over the ``WINDOWS[window]`` (kh, kw, stride) window at row ``r * stride
- pt`` and column ``j * stride - pl``, its rows and columns that lie inside the plane only
(padding never wins; a window whose columns are all outside gives -inf). Every output
row's window must hold a row of the plane (``window_fits``: the caller's condition). NaN
propagates as with ``np.maximum``: the larger, the first of equals, NaN where any is NaN --
``pool_direct._mx``'s values, rows first, then columns.

``avgpool(x, y, planes, h, w, oh, ow, pt, pl, scale, window)``: AveragePool's sums, the
same windows: ``y[r, j]`` = the sum of the window's taps inside the plane (rows, then
columns; rows outside read as zeros, not clamped: any pads) times ``scale[r,
j]`` (an ``oh`` x ``ow`` float32 plane, every plane's: ``pool``'s 1 / divisor).

What the numba loops cannot express: per vector of ``lanes`` outputs, the window's rows'
maxima of the input columns it covers stay in registers (the block after it carried to the
next output block), and each tap's column is a shuffle of them -- stride 2 splits them into
even and odd columns -- so there are no strided reads and no pass over a temporary. The
window's rows are clamped into the plane (a row counted twice does not change a max);
columns outside it are masked loads that read -inf (no fault past either end of a row or of
the buffer); the next output row's new input rows are prefetched. Stride-1 windows take
their output rows two at a time, the kh - 1 input rows the two share reduced once (a max
of (a, (b, c)) keeps the first of equal values; the sums' grouping changes their rounding
only): 3x3/1 at 192x28x28 82 -> 66 µs, AveragePool 3x3/1 at 768x17x17 239 -> 178 (one
Zen 5 thread).

``kernel()`` (``kernel(avg=True)``: the average's) is the numba ExternalFunction (pointers
as integers, status 0; 1 for a window index not built), None where
there is no llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable`` or the packed kernels are
switched off. Vectors of 16 outputs with AVX-512F (``$TFRT_PY_ISA`` permitting), 8 with
AVX2; a stride-1 window at most one wider than the vector. Built once per process under a
lock (its machine code cached as the packed gemms'); stateless; any thread.
"""

from __future__ import annotations

import os
from typing import Any

from ...concurrency import compiled_gate
from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from .gemm_packed import ENV_ISA, ENV_PACKED_GEMM, IR_HELPERS, counted_loop, wide_vectors

__all__ = ["SYMBOL", "SYMBOL_AVG", "WINDOWS", "build", "describe", "host_lanes", "kernel",
           "lanes", "register_lanes", "window_fits", "window_index"]  # fmt: skip

SYMBOL = "tfrt_py_maxpool_f32"
SYMBOL_AVG = "tfrt_py_avgpool_f32"
#: (kh, kw, stride) of the windows built; ``pool``'s ``window`` is an index here.
WINDOWS = ((3, 3, 2), (2, 2, 2), (3, 3, 1), (5, 5, 1), (9, 9, 1), (13, 13, 1))


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
    return compile_ir_cached(
        lambda: _PoolIR(n).text(), f"pool_ir|{n}", (__file__, *IR_HELPERS), opt=3
    )[0]


def window_index(kernel: tuple[int, ...], strides: tuple[int, ...], n: int) -> int:
    """The index in ``WINDOWS`` of a (kh, kw) window of equal strides, -1 where none is or
    (stride 1) it is wider than ``n`` + 1 lanes allow."""
    if len(kernel) != 2 or len(strides) != 2 or strides[0] != strides[1]:
        return -1
    key = (int(kernel[0]), int(kernel[1]), int(strides[0]))
    if key not in WINDOWS or (key[2] == 1 and key[1] > n + 1):
        return -1
    return WINDOWS.index(key)


def window_fits(x_shape: tuple[int, ...], out_shape: tuple[int, ...], kernel: tuple[int, ...],
                strides: tuple[int, ...], pads_begin: tuple[int, ...]) -> bool:  # fmt: skip
    """Whether every output row's window holds a row of the plane and every output column's
    window starts at most a window's width before the row (the kernel's condition), with
    dims its 32-bit lane arithmetic holds."""
    h, w = x_shape[2], x_shape[3]
    if max(h, w) >= 1 << 30 or pads_begin[0] > kernel[0] - 1 or pads_begin[1] > kernel[1] - 1:
        return False
    return (out_shape[2] - 1) * strides[0] - pads_begin[0] <= h - 1


class _PoolIR:
    """The module: ``SYMBOL`` dispatching to one function per window of ``WINDOWS``, for
    vectors of ``n`` float32 outputs."""

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
        self.zero = ir.Constant(self.vf, [0.0] * n)
        self.avg = False
        self.pair = False
        self.valid: list[Any] = []
        i8p = ir.IntType(8).as_pointer()
        pf_t = ir.FunctionType(ir.VoidType(), [i8p, *[self.i32] * 3])
        self.prefetch = ir.Function(self.mod, pf_t, name="llvm.prefetch.p0i8")
        self.iota = ir.Constant(self.vi, list(range(n)))

    def c(self, v: int) -> Any:
        return self.ir.Constant(self.i64, v)

    def text(self) -> str:
        names = [*self.family(SYMBOL, False), *self.family(SYMBOL_AVG, True)]
        text = str(self.mod)
        return wide_vectors(text, names) if self.n * 32 > 256 else text

    def family(self, symbol: str, avg: bool) -> list[str]:
        """One function per window (avg: one more argument, the scales) and ``symbol``,
        which dispatches on its last argument, the window's index: their names."""
        ir, i64 = self.ir, self.i64
        fp = self.f32.as_pointer()
        args = [fp, fp, *[i64] * 7, *([fp] if avg else [])]
        fns: list[Any] = []
        for k, (kh, kw, st) in enumerate(WINDOWS):
            if st == 1 and kw > self.n + 1:
                fns.append(None)
                continue
            fn = ir.Function(self.mod, ir.FunctionType(i64, args), name=f"{symbol}_{k}")
            self.function(fn, kh, kw, st, avg)
            fns.append(fn)
        top = ir.Function(self.mod, ir.FunctionType(i64, [*args, i64]), name=symbol)
        b = ir.IRBuilder(top.append_basic_block("entry"))
        bad = top.append_basic_block("bad")
        sw = b.switch(top.args[-1], bad)
        for k, fn in enumerate(fns):
            if fn is None:
                continue
            blk = top.append_basic_block(f"w{k}")
            sw.add_case(ir.Constant(i64, k), blk)
            b.position_at_end(blk)
            b.ret(b.call(fn, top.args[:-1]))
        b.position_at_end(bad)
        b.ret(self.c(1))
        return [symbol] + [fn.name for fn in fns if fn is not None]

    def splat(self, value: Any) -> Any:
        b, ir = self.b, self.ir
        e = b.insert_element(ir.Constant(self.vi, ir.Undefined), value, ir.Constant(self.i32, 0))
        zeros = ir.Constant(ir.VectorType(self.i32, self.n), [0] * self.n)
        return b.shuffle_vector(e, ir.Constant(self.vi, ir.Undefined), zeros)

    def maxn(self, vs: list[Any]) -> Any:
        """``_mx`` folded over ``vs``: the larger, the first of equals; NaN where any is."""
        b = self.b
        m = vs[0]
        for v in vs[1:]:
            m = b.select(b.fcmp_ordered(">", v, m), v, m)
        if len(vs) == 1:
            return m
        nan = None
        for k in range(0, len(vs), 2):  # one unordered compare covers two
            u = b.fcmp_unordered("uno", vs[k], vs[min(k + 1, len(vs) - 1)])
            nan = u if nan is None else b.or_(nan, u)
        return b.select(nan, self.nan, m)

    def sumn(self, vs: list[Any]) -> Any:
        """``vs`` added in order."""
        m = vs[0]
        for v in vs[1:]:
            m = self.b.fadd(m, v)
        return m

    def rows_reduced(self, rows: list[Any], col: Any, w: Any | None) -> list[Any]:
        """Per output row (one, or with ``self.pair`` two: ``rows[:-1]`` and ``rows[1:]``),
        the max over its rows (pointers) of the ``n`` columns from ``col`` (avg: their sum;
        a pair's shared rows reduced once); with ``w``, -inf (avg: 0) where a column is
        outside ``[0, w)`` or (avg) a row outside the plane (``self.valid``), by masked
        loads; else all inside."""
        b, ir = self.b, self.ir
        vp, four = self.vf.as_pointer(), ir.Constant(self.i32, 4)
        ptrs = [b.bitcast(b.gep(r, [col]), vp) for r in rows]
        if w is None:
            got = [b.load(p, align=4) for p in ptrs]
        else:
            at = b.add(self.splat(b.trunc(col, self.i32)), self.iota)
            inside = b.and_(b.icmp_signed(">=", at, ir.Constant(self.vi, [0] * self.n)),
                            b.icmp_signed("<", at, self.splat(b.trunc(w, self.i32))))  # fmt: skip
            if self.avg:
                masks = [b.and_(inside, self.splat_bit(v)) for v in self.valid]
                got = [b.call(self.mload, [p, four, m, self.zero]) for p, m in zip(ptrs, masks)]
            else:
                got = [b.call(self.mload, [p, four, inside, self.ninf]) for p in ptrs]
        red = self.sumn if self.avg else self.maxn
        if not self.pair:
            return [red(got)]
        shared = red(got[1:-1])  # in order: (a, (b, c)) keeps the first of equal maxima
        return [red([got[0], shared]), red([shared, got[-1]])]

    def splat_bit(self, bit: Any) -> Any:
        b, ir = self.b, self.ir
        vm = ir.VectorType(self.i1, self.n)
        e = b.insert_element(ir.Constant(vm, ir.Undefined), bit, ir.Constant(self.i32, 0))
        zeros = ir.Constant(ir.VectorType(self.i32, self.n), [0] * self.n)
        return b.shuffle_vector(e, ir.Constant(vm, ir.Undefined), zeros)

    def function(self, fn: Any, kh: int, kw: int, st: int, avg: bool) -> None:
        fn.args[0].add_attribute("noalias")
        fn.args[1].add_attribute("noalias")
        self.b = b = self.ir.IRBuilder(fn.append_basic_block("entry"))
        self.avg = avg
        x, y, planes, h, w, oh, ow, pt, pl = fn.args[:9]
        self.scale = fn.args[9] if avg else None
        in_plane, out_plane = b.mul(h, w), b.mul(oh, ow)
        geo = (kh, kw, st)

        def plane(p: Any) -> None:
            xp, yp = b.gep(x, [b.mul(p, in_plane)]), b.gep(y, [b.mul(p, out_plane)])

            def row(r: Any) -> None:
                self.row(geo, xp, yp, r, h, w, ow, pt, pl)

            if st != 1:
                self.pair = False
                counted_loop(b, self.c(0), oh, 1, row, whole=False)
                return
            # stride 1: output rows two at a time, their kh - 1 shared rows reduced once
            self.pair = True
            counted_loop(b, self.c(0), oh, 2, row, whole=True)
            self.pair = False
            odd, done = b.function.append_basic_block(), b.function.append_basic_block()
            b.cbranch(b.icmp_signed("!=", b.and_(oh, self.c(1)), self.c(0)), odd, done)
            b.position_at_end(odd)
            row(b.sub(oh, self.c(1)))
            b.branch(done)
            b.position_at_end(done)

        counted_loop(b, self.c(0), planes, 1, plane, whole=False)
        b.ret(self.c(0))

    def shifted(self, blocks: list[Any], t: int) -> Any:
        """Lanes ``[t, t + n)`` of ``blocks`` laid end to end."""
        n, b, ir = self.n, self.b, self.ir
        q, r = divmod(t, n)
        if r == 0:
            return blocks[q]
        idx = ir.Constant(ir.VectorType(self.i32, n), list(range(r, r + n)))
        return b.shuffle_vector(blocks[q], blocks[q + 1], idx)

    def row(self, geo: tuple[int, int, int], xp: Any, yp: Any, r: Any, h: Any, w: Any,
            ow: Any, pt: Any, pl: Any) -> None:  # fmt: skip
        """Output row ``r`` (with ``self.pair``, rows ``r`` and ``r + 1``), ``n`` outputs a
        block. Each block needs the rows' maxima of ``span`` input columns from ``col``
        (stride 2: 2n, and one more for a 3-wide window; stride 1: n + kw - 1), in ``need``
        vectors: the first carried from the block before (the columns it read past its
        own), the rest loaded."""
        kh, kw, st = geo
        ir, b, c, n = self.ir, self.b, self.c, self.n
        outs = 2 if self.pair else 1
        i8p = ir.IntType(8).as_pointer()
        top = b.sub(b.mul(r, c(st)), pt)
        last = b.sub(h, c(1))

        def clamped(i: int) -> Any:  # row top + i clamped into the plane
            k = b.add(top, c(i))
            k = b.select(b.icmp_signed("<", k, c(0)), c(0), k)
            k = b.select(b.icmp_signed(">", k, last), last, k)
            return b.gep(xp, [b.mul(k, w)])

        span = kh + outs - 1  # the input rows the output rows read
        rows = [clamped(i) for i in range(span)]
        ahead = [clamped(span + i) for i in range(st * outs)]  # the next pass's new rows
        all_rows = self.ir.Constant(self.i1, 1)
        if self.avg:  # a row outside the plane adds nothing (a max counts its clamped twin)
            self.valid = []
            for i in range(span):
                k = b.add(top, c(i))
                self.valid.append(
                    b.and_(b.icmp_signed(">=", k, c(0)), b.icmp_signed("<=", k, last))
                )
            all_rows = b.and_(self.valid[0], self.valid[-1])
        yrs = [b.gep(yp, [b.mul(b.add(r, c(o)), ow)]) for o in range(outs)]
        step = st * n  # input columns an output block advances
        need = 3 if (st == 2 and kw == 3) else 2
        carry = st == 1 or kw == 3  # the last vector is the next block's first
        col0 = b.sub(c(0), pl)
        pre = b.block
        first = self.rows_reduced(rows, col0, w) if carry else None
        head, body, after = (b.function.append_basic_block() for _ in range(3))
        b.branch(head)
        b.position_at_end(head)
        j, col = b.phi(self.i64), b.phi(self.i64)
        j.add_incoming(c(0), pre)
        col.add_incoming(col0, pre)
        los: list[Any] = []
        if carry:
            assert first is not None
            for o in range(outs):
                lo = b.phi(self.vf)
                lo.add_incoming(first[o], pre)
                los.append(lo)
        b.cbranch(b.icmp_signed("<", j, ow), body, after)
        b.position_at_end(body)
        # the block's new vectors: plain loads where all lie inside the row, else masked
        new_from = 1 if carry else 0
        end = b.add(col, c(need * n))
        inside = b.and_(b.icmp_signed(">=", col, c(0)), b.icmp_signed("<=", end, w))
        inside = b.and_(inside, all_rows)
        fast, slow, join = (b.function.append_basic_block() for _ in range(3))
        b.cbranch(inside, fast, slow)
        got = []
        for blk, bound in ((fast, None), (slow, w)):
            b.position_at_end(blk)
            if bound is None:  # the next output row's new rows: short row streams the
                for a in ahead:  # hardware prefetcher leaves to memory at large planes
                    for q in range(0, need * n, 16):
                        at = b.bitcast(b.gep(a, [b.add(col, c(step + q))]), i8p)
                        hint = [ir.Constant(self.i32, v) for v in (0, 3, 1)]
                        b.call(self.prefetch, [at, *hint])
            vs = [self.rows_reduced(rows, b.add(col, c(k * n)), bound)
                  for k in range(new_from, need)]  # fmt: skip
            got.append((vs, b.block))
            b.branch(join)
        b.position_at_end(join)
        per_row: list[list[Any]] = [[los[o]] if carry else [] for o in range(outs)]
        for k in range(need - new_from):
            for o in range(outs):
                phi = b.phi(self.vf)
                for vs, blk in got:
                    phi.add_incoming(vs[k][o], blk)
                per_row[o].append(phi)
        lane = b.add(self.splat(b.trunc(j, self.i32)), self.iota)
        keep = b.icmp_signed("<", lane, self.splat(b.trunc(ow, self.i32)))
        four = ir.Constant(self.i32, 4)
        outs_v = [self.window(blocks, kw, st) for blocks in per_row]
        # plain moves where the vector lies inside the output row: AVX2's masked store
        # (``vmaskmovps``) costs ~4 ns on Zen 3
        with b.if_else(b.icmp_signed("<=", b.add(j, c(n)), ow)) as (whole, part):
            for arm, mask in ((whole, None), (part, keep)):
                with arm:
                    for o, out in enumerate(outs_v):
                        vp = self.vf.as_pointer()
                        if self.avg:  # times the output's 1 / divisor (``scale``: oh x ow)
                            at = b.add(b.mul(b.add(r, c(o)), ow), j)
                            sp = b.bitcast(b.gep(self.scale, [at]), vp)
                            sv = (b.load(sp, align=4) if mask is None
                                  else b.call(self.mload, [sp, four, mask, self.zero]))  # fmt: skip
                            out = b.fmul(out, sv)
                        ptr = b.bitcast(b.gep(yrs[o], [j]), vp)
                        if mask is None:
                            b.store(out, ptr, align=4)
                        else:
                            b.call(self.mstore, [out, ptr, four, mask])
        j.add_incoming(b.add(j, c(n)), b.block)
        col.add_incoming(b.add(col, c(step)), b.block)
        for o in range(outs if carry else 0):
            los[o].add_incoming(per_row[o][-1], b.block)
        b.branch(head)
        b.position_at_end(after)

    def window(self, blocks: list[Any], kw: int, st: int) -> Any:
        """One output row's block from its vectors of column maxima (sums): each tap's
        column a shuffle of them, then their max (sum)."""
        b, ir, n = self.b, self.ir, self.n
        if st == 2:
            idx = ir.VectorType(self.i32, n)

            def pick(u: Any, v: Any, lanes: range) -> Any:
                return b.shuffle_vector(u, v, ir.Constant(idx, list(lanes)))

            even = pick(blocks[0], blocks[1], range(0, 2 * n, 2))
            taps = [even, pick(blocks[0], blocks[1], range(1, 2 * n, 2))]
            if kw == 3:  # the even columns one further: the next block's first column
                taps.append(pick(even, blocks[2], range(1, n + 1)))
        else:
            taps = [self.shifted(blocks, t) for t in range(kw)]
        return self.sumn(taps) if self.avg else self.maxn(taps)


def register_lanes(build: Any, signatures: Any, unit: str) -> tuple[str, Any, Any]:
    """The kernels of ``build(lanes())`` registered with LLVM, for a module's ``Once``:
    (why, the ExternalFunctions of ``signatures(numba.types)`` -- (symbol, signature)
    pairs -- in their order, or None, the engine or None). None where this process has no
    width (``lanes()`` 0) or the build fails (no llvmlite JIT: the caller's loop stays)."""
    try:
        from numba import types

        n = lanes()
        if not n:
            return "no AVX2 (or $TFRT_PY_ISA=portable)", None, None
        engine = build(n)
        fns = []
        for symbol, sig in signatures(types):
            add_symbol(symbol, engine.get_function_address(symbol))
            fns.append(types.ExternalFunction(symbol, sig))
    except Exception as e:  # noqa: BLE001 - no llvmlite JIT here: the caller's loop stays
        return f"the kernel did not build: {type(e).__name__}", None, None
    return f"vectors of {n} {unit}", tuple(fns), engine


def _signatures(t: Any) -> list[tuple[str, Any]]:
    p, i = t.uintp, t.int64
    return [(SYMBOL, t.int64(p, p, i, i, i, i, i, i, i, i)),
            (SYMBOL_AVG, t.int64(p, p, i, i, i, i, i, i, i, p, i))]  # fmt: skip


#: (why, (max, avg) ExternalFunctions or None, engine or None), decided on first use
_DECIDED: Once[tuple[str, Any, Any]] = Once(lambda: register_lanes(build, _signatures, "float32"))


def kernel(avg: bool = False) -> Any:
    """The max pool's ExternalFunction (module docstring; ``avg``: the average pool's),
    None where the kernel is off."""
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return None
    fns = _DECIDED.get()[1]
    return None if fns is None else fns[int(avg)]


def describe() -> str:
    """How the kernel was decided ("" before it was)."""
    got = _DECIDED.peek()
    return got[0] if got else ""
