"""4-bit weights times int8 activations, block by block: the LLVM IR kernel under
MatMulNBits at ``accuracy_level=4`` (``contrib/matmul_nbits``), where onnxruntime quantizes
A to int8 per block and multiplies in integers (MLAS's ``CompInt8``).

``gemv(codes, qa, ablk, scale, zp, y, ldy, m, k_groups, gpb, p0, p1) -> 0``: for the
panels ``p0 <= p < p1`` of 64 output columns and each of ``m`` rows ``r``::

    y[r * ldy + p * 64 + c] = sum over blocks b of
        ablk[r, b, 0] * scale[p, b, c] * sum_k qa[r, k] * code[k, c]
        - ablk[r, b, 1] * (scale[p, b, c] * zp[p, b, c])

with ``k`` over block ``b`` (``gpb`` groups of 8 k's, ``gpb`` even), ``ablk[r, b] = (a's
scale, a's scale * sum of the block's qa)`` float32, ``qa`` int8 rows ``8 * k_groups``
apart, ``scale`` (panels, blocks, 64) float32 and ``zp`` (panels, blocks, 64) uint8 (the
weight's scales and zero points; zero points as bytes: a quarter of a float's memory
traffic). The codes are (panels, k_groups, 64, 4) bytes: byte ``j`` of column ``c`` in
group ``g`` holds ``code[8g + j]`` in its low nibble and ``code[8g + 4 + j]`` in its high
one (``pack``), so one 32-bit lane is one column's four k's, as ``vpdpbusd`` takes them.

Every block's integer sum is exact on every path: ``vpdpbusd`` (VNNI) sums in int32; the
paths without it use ``vpmaddubsw``, whose int16 pair sums cannot saturate here (codes <=
15, ``|qa| <= 127``: two groups of pairs <= 4 * 15 * 127 < 2**15), then ``vpmaddwd`` by ones
into int32 every two groups. The float side (the block's int32 sum times the two scales,
the zero point's term) is float32, in this order, summed in ``y`` itself (zeroed first).
A pass over a panel's codes unpacks each vector once for ``ROWS[path]`` rows of A (a
prompt's rows share the unpacking; a decode step's one row takes single-row passes).

``quant(a, m, kp, block, qa, ablk) -> 0`` makes ``qa`` and ``ablk`` from ``m`` float32
rows ``kp`` apart (``kp`` a multiple of ``block``, zeros past K) as MLAS quantizes A at
level 4: per block ``amax = max |a|`` (its bits' largest: an inf or NaN makes the block's
``ablk`` NaN, its codes 0), ``qa = rint(a * (127 / amax))`` (0 where amax is 0; half to even),
``ablk = (amax / 127, amax / 127 * sum qa)``.

Paths: ``qgemm_packed``'s names and choice (``choose_path``): ``vnni512``/``avx512`` on zmm
(4 vectors of 16 columns), ``vnni256``/``avx2`` on ymm (8 of 8); ``portable`` (or no
llvmlite JIT, or the packed kernels switched off): ``kernel()`` is None and the caller
multiplies in float32 what the same quantized A dequantizes to. Built once per process under
a lock (its machine code cached as the packed gemms'); stateless; any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import compiled_gate
from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from .gemm_packed import ENV_PACKED_GEMM, IR_HELPERS, counted_loop, wide_vectors
from .qgemm_packed import choose_path, host_paths

__all__ = ["PATHS", "ROWS", "SYMBOL", "SYMBOL_QUANT", "build", "describe", "kernel", "pack", "path"]

SYMBOL = "tfrt_py_qnbits_gemv"
SYMBOL_QUANT = "tfrt_py_qnbits_quant"
#: path -> (lanes, vnni)
PATHS = {"vnni512": (16, True), "avx512": (16, False), "vnni256": (8, True), "avx2": (8, False)}
#: path -> rows of A a pass over a panel's codes takes (their accumulators in registers:
#: 4 rows x 4 zmm with VNNI, 2 x (4 + 4 int16) without; ymm paths have 16 registers)
ROWS = {"vnni512": 4, "avx512": 2, "vnni256": 1, "avx2": 1}


def pack(codes: np.ndarray) -> np.ndarray:
    """(N, 8 * k_groups) 4-bit codes (uint8 0..15) as the kernel's (panels, k_groups, 64, 4)
    bytes (module docstring), zero columns past N."""
    n, kp = codes.shape
    panels = -(-n // 64)
    full = np.zeros((panels * 64, kp), np.uint8)
    full[:n] = codes
    g = full.reshape(panels, 64, kp // 8, 2, 4)
    both = g[:, :, :, 0, :] | (g[:, :, :, 1, :] << np.uint8(4))  # (panels, 64, groups, 4)
    raw = np.empty(both.size + 64, np.uint8)  # from a 64-byte line: no load splits one
    at = -raw.ctypes.data & 63
    out = raw[at : at + both.size].reshape(panels, kp // 8, 64, 4)
    out[...] = both.transpose(0, 2, 1, 3)
    return out


def _text(path: str) -> str:
    import llvmlite.ir as ir

    lanes, vnni = PATHS[path]
    vecs = 64 // lanes
    i8, i16, i32, i64, f32 = (ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64),
                              ir.FloatType())  # fmt: skip
    vb, vw, vd, vf = (ir.VectorType(i8, 4 * lanes), ir.VectorType(i16, 2 * lanes),
                      ir.VectorType(i32, lanes), ir.VectorType(f32, lanes))  # fmt: skip
    vz = ir.VectorType(i8, lanes)
    mod = ir.Module(name="tfrt_py_qnbits")
    bits = 512 if lanes == 16 else 256
    if vnni:
        dot = ir.Function(mod, ir.FunctionType(vd, [vd, vd, vd]),
                          name=f"llvm.x86.avx512.vpdpbusd.{bits}")  # fmt: skip
    else:
        ubsw = "llvm.x86.avx512.pmaddubs.w.512" if lanes == 16 else "llvm.x86.avx2.pmadd.ub.sw"
        wd = "llvm.x86.avx512.pmaddw.d.512" if lanes == 16 else "llvm.x86.avx2.pmadd.wd"
        maddubs = ir.Function(mod, ir.FunctionType(vw, [vb, vb]), name=ubsw)
        maddwd = ir.Function(mod, ir.FunctionType(vd, [vw, vw]), name=wd)
    fma = ir.Function(mod, ir.FunctionType(vf, [vf, vf, vf]), name=f"llvm.fma.v{lanes}f32")
    p8, pf = i8.as_pointer(), f32.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(i64, [p8, p8, pf, pf, p8, pf, *[i64] * 6]),
                     name=SYMBOL)  # fmt: skip
    codes, qa, ablk, scale, zps, y, ldy, m, k_groups, gpb, p0, p1 = fn.args
    for arg in (codes, qa, ablk, scale, zps):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(v: int) -> Any:
        return ir.Constant(i64, v)

    zero_d, zero_w, zero_f = ir.Constant(vd, None), ir.Constant(vw, None), ir.Constant(vf, None)
    low = ir.Constant(vb, [15] * (4 * lanes))
    four = ir.Constant(vb, [4] * (4 * lanes))
    ones = ir.Constant(vw, [1] * (2 * lanes))
    most = ROWS[path]
    iacc = [[b.alloca(vd) for _ in range(vecs)] for _ in range(most)]
    wacc = [[b.alloca(vw) for _ in range(vecs)] for _ in range(most)]
    k_blocks = b.sdiv(k_groups, gpb)

    def splat_i32(at: Any) -> Any:  # qa's 4 bytes at ``at`` in every 32-bit lane
        word = b.load(b.bitcast(b.gep(qa, [at]), i32.as_pointer()), align=1)
        v = b.insert_element(ir.Constant(vd, None), word, c(0))
        return b.bitcast(b.shuffle_vector(v, v, ir.Constant(vd, None)), vb)

    def splat_f32(value: Any) -> Any:
        v = b.insert_element(ir.Constant(vf, None), value, c(0))
        return b.shuffle_vector(v, v, ir.Constant(vd, None))

    def group(p: Any, r0: Any, rows: int, g: Any) -> None:  # 8 k's, 64 columns, the rows
        a_at = [b.add(b.mul(b.add(r0, c(j)), b.mul(k_groups, c(8))), b.mul(g, c(8)))
                for j in range(rows)]  # fmt: skip
        a_lo = [splat_i32(at) for at in a_at]
        a_hi = [splat_i32(b.add(at, c(4))) for at in a_at]
        base = b.mul(b.add(b.mul(p, k_groups), g), c(256))
        for v in range(vecs):
            at = b.bitcast(b.gep(codes, [b.add(base, c(v * 4 * lanes))]), vb.as_pointer())
            x = b.load(at, align=1)
            lo, hi = b.and_(x, low), b.lshr(x, four)
            for j in range(rows):
                if vnni:
                    acc = b.load(iacc[j][v])
                    acc = b.call(dot, [acc, b.bitcast(lo, vd), b.bitcast(a_lo[j], vd)])
                    acc = b.call(dot, [acc, b.bitcast(hi, vd), b.bitcast(a_hi[j], vd)])
                    b.store(acc, iacc[j][v])
                else:
                    s = b.add(b.call(maddubs, [lo, a_lo[j]]), b.call(maddubs, [hi, a_hi[j]]))
                    b.store(b.add(b.load(wacc[j][v]), s), wacc[j][v])

    def pair(p: Any, r0: Any, rows: int, g: Any) -> None:  # without VNNI widened after two
        group(p, r0, rows, g)
        group(p, r0, rows, b.add(g, c(1)))
        if not vnni:
            for j in range(rows):
                for v in range(vecs):
                    wide = b.call(maddwd, [b.load(wacc[j][v]), ones])
                    b.store(b.add(b.load(iacc[j][v]), wide), iacc[j][v])
                    b.store(zero_w, wacc[j][v])

    def block(p: Any, r0: Any, rows: int, blk: Any) -> None:
        for j in range(rows):
            for v in range(vecs):
                b.store(zero_d, iacc[j][v])
                b.store(zero_w, wacc[j][v])
        g0 = b.mul(blk, gpb)
        counted_loop(b, g0, b.add(g0, gpb), 2, lambda g: pair(p, r0, rows, g))
        sb = b.mul(b.add(b.mul(p, k_blocks), blk), c(64))
        sz = []
        for v in range(vecs):
            off = b.add(sb, c(v * lanes))
            s = b.load(b.bitcast(b.gep(scale, [off]), vf.as_pointer()), align=4)
            z8 = b.load(b.bitcast(b.gep(zps, [off]), vz.as_pointer()), align=1)
            sz.append((s, b.fmul(s, b.uitofp(z8, vf))))
        for j in range(rows):
            at = b.mul(b.add(b.mul(b.add(r0, c(j)), k_blocks), blk), c(2))
            sa = splat_f32(b.load(b.gep(ablk, [at])))
            nsq = splat_f32(b.fneg(b.load(b.gep(ablk, [b.add(at, c(1))]))))
            for v in range(vecs):
                s, z = sz[v]
                d = b.sitofp(b.load(iacc[j][v]), vf)
                at = out_at(p, r0, j, v)
                f = b.call(fma, [d, b.fmul(s, sa), b.load(at, align=4)])
                b.store(b.call(fma, [z, nsq, f]), at, align=4)

    def out_at(p: Any, r0: Any, j: int, v: int) -> Any:  # y's vector v of row r0 + j
        out = b.add(b.mul(b.add(r0, c(j)), ldy), b.add(b.mul(p, c(64)), c(v * lanes)))
        return b.bitcast(b.gep(y, [out]), vf.as_pointer())

    def rows_of(p: Any, r0: Any, rows: int) -> None:  # the float sums in y (in L1)
        for j in range(rows):
            for v in range(vecs):
                b.store(zero_f, out_at(p, r0, j, v), align=4)
        counted_loop(b, c(0), k_blocks, 1, lambda blk: block(p, r0, rows, blk))

    def panel(p: Any) -> None:  # rows ``most`` at a time (the codes unpacked once for them)
        whole = c(0)
        if most > 1:
            whole = b.mul(b.sdiv(m, c(most)), c(most))
            counted_loop(b, c(0), whole, most, lambda r0: rows_of(p, r0, most))
        counted_loop(b, whole, m, 1, lambda r: rows_of(p, r, 1), whole=False)

    counted_loop(b, p0, p1, 1, panel)
    b.ret(c(0))
    _quantizer(mod, lanes)
    text = str(mod)
    return wide_vectors(text, [SYMBOL, SYMBOL_QUANT]) if lanes == 16 else text


def _quantizer(mod: Any, lanes: int) -> None:
    """``SYMBOL_QUANT(a, m, kp, block, qa, ablk) -> 0`` into ``mod`` (module docstring)."""
    import llvmlite.ir as ir

    i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
    vf, vd, vb = ir.VectorType(f32, lanes), ir.VectorType(i32, lanes), ir.VectorType(i8, lanes)
    rint = ir.Function(mod, ir.FunctionType(vf, [vf]), name=f"llvm.rint.v{lanes}f32")
    smax = ir.Function(mod, ir.FunctionType(i32, [vd]), name=f"llvm.vector.reduce.smax.v{lanes}i32")
    add = ir.Function(mod, ir.FunctionType(i32, [vd]), name=f"llvm.vector.reduce.add.v{lanes}i32")
    pf = f32.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(i64, [pf, i64, i64, i64, i8.as_pointer(), pf]),
                     name=SYMBOL_QUANT)  # fmt: skip
    a, m, kp, block, qa, ablk = fn.args
    for arg in (a, qa, ablk):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(v: int) -> Any:
        return ir.Constant(i64, v)

    absmask = ir.Constant(vd, [0x7FFFFFFF] * lanes)
    top_acc, sum_acc = b.alloca(vd), b.alloca(vd)
    k_blocks = b.sdiv(kp, block)

    def vec_at(base: Any, at: Any, t: Any) -> Any:
        return b.bitcast(b.gep(base, [at]), t.as_pointer())

    def blk_of(r: Any, blk: Any) -> None:
        k0 = b.add(b.mul(r, kp), b.mul(blk, block))
        b.store(ir.Constant(vd, None), top_acc)

        def top(i: Any) -> None:  # the largest |a| as the largest of its bits
            x = b.and_(b.bitcast(b.load(vec_at(a, i, vf), align=4), vd), absmask)
            t = b.load(top_acc)
            b.store(b.select(b.icmp_signed(">", x, t), x, t), top_acc)

        counted_loop(b, k0, b.add(k0, block), lanes, top)
        most = b.call(smax, [b.load(top_acc)])
        at = b.mul(b.add(b.mul(r, k_blocks), blk), c(2))
        bad = b.icmp_signed(">=", most, ir.Constant(i32, 0x7F800000))  # inf or NaN
        with b.if_else(bad) as (then, otherwise):
            with then:  # the block's outputs are NaN
                nan = ir.Constant(f32, float("nan"))
                b.store(nan, b.gep(ablk, [at]))
                b.store(nan, b.gep(ablk, [b.add(at, c(1))]))

                def clear(i: Any) -> None:
                    b.store(ir.Constant(vb, None), vec_at(qa, i, vb), align=1)

                counted_loop(b, k0, b.add(k0, block), lanes, clear)
            with otherwise:
                amax = b.bitcast(most, f32)
                zero = b.icmp_signed("==", most, ir.Constant(i32, 0))
                inv = b.select(zero, ir.Constant(f32, 0.0), b.fdiv(ir.Constant(f32, 127.0), amax))
                iv = b.insert_element(ir.Constant(vf, None), inv, c(0))
                iv = b.shuffle_vector(iv, iv, ir.Constant(vd, None))
                b.store(ir.Constant(vd, None), sum_acc)

                def quant(i: Any) -> None:  # round half to even, as MLAS's roundscale
                    q = b.fptosi(b.call(rint, [b.fmul(b.load(vec_at(a, i, vf), align=4), iv)]), vd)
                    b.store(b.trunc(q, vb), vec_at(qa, i, vb), align=1)
                    b.store(b.add(b.load(sum_acc), q), sum_acc)

                counted_loop(b, k0, b.add(k0, block), lanes, quant)
                sc = b.fdiv(amax, ir.Constant(f32, 127.0))
                b.store(sc, b.gep(ablk, [at]))
                total = b.sitofp(b.call(add, [b.load(sum_acc)]), f32)
                b.store(b.fmul(sc, total), b.gep(ablk, [b.add(at, c(1))]))

    def row(r: Any) -> None:
        counted_loop(b, c(0), k_blocks, 1, lambda blk: blk_of(r, blk))

    counted_loop(b, c(0), m, 1, row)
    b.ret(c(0))


def build(path_: str) -> Any:
    """The engine holding the kernel compiled for ``path_`` (one of ``PATHS`` this host
    runs): for tests and benchmarks of a path apart from the process's. Raises what
    llvmlite raises."""
    return compile_ir_cached(
        lambda: _text(path_), f"qnbits_ir|{path_}", (__file__, *IR_HELPERS), opt=3
    )[0]


def _register() -> tuple[str, str, Any, Any]:
    try:
        from numba import types

        chosen, why = choose_path()
        if chosen not in PATHS:
            return chosen, why, None, None
        if chosen not in host_paths():  # pragma: no cover - choose_path picks among them
            return "portable", f"{chosen} is not a path of this host", None, None
        engine = build(chosen)
        add_symbol(SYMBOL, engine.get_function_address(SYMBOL))
        add_symbol(SYMBOL_QUANT, engine.get_function_address(SYMBOL_QUANT))
        p, n = types.uintp, types.int64
        fn = types.ExternalFunction(SYMBOL, types.int64(p, p, p, p, p, p, n, n, n, n, n, n))
        quant = types.ExternalFunction(SYMBOL_QUANT, types.int64(p, n, n, n, p, p))
    except Exception as e:  # noqa: BLE001 - no llvmlite JIT here: the float product serves
        return "portable", f"the kernel did not build: {type(e).__name__}", None, None
    return chosen, why, (fn, quant), engine


#: (path, why, (product, quantizer) ExternalFunctions or None, engine or None), decided on first use
_DECIDED: Once[tuple[str, str, Any, Any]] = Once(_register)


def kernel() -> Any:
    """The ExternalFunctions (product, quantizer) (module docstring), None where the
    kernel is off."""
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return None
    return _DECIDED.get()[2]


def path() -> str:
    """This process's path (deciding, and building, on the first call)."""
    return _DECIDED.get()[0]


def describe() -> str:
    """How the kernel was decided ("" before it was), or that it is switched off."""
    if switched_off(ENV_PACKED_GEMM):
        return f"off (${ENV_PACKED_GEMM}=0)"
    got = _DECIDED.peek()
    return f"{got[0]} ({got[1]})" if got else ""
