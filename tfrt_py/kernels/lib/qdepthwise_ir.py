"""One output row of a channels-last depthwise QLinearConv over a staged float32 band: the
LLVM IR kernel ``nn/conv_qdepthwise`` calls per row for 3x3, 5x5 and 7x7 windows.

``row(rows, c, dj, step, w, bias, scale, params, out, n_ow)``: for each output pixel ``ow <
n_ow`` and channel ``ch < c``, ``out[ow * c + ch] = int(round_half_even(clamp((bias[ch] + sum
of w[t * c + ch] * rows[i][ow * step + j * dj + ch] over the taps t = i * kw + j) *
scale[ch], lo - zp, hi - zp)) + zp)`` with ``params = [lo - zp, hi - zp, zp]`` (float32),
``rows`` the addresses (int64) of the window's ``kh`` staged input rows (the codes minus
their zero point, as float32, zero padded; anywhere: the caller keeps them in a ring), ``w``
tap-major ``(kh * kw, c)``. Every sum is an integer below 2**24 (the caller's condition,
``conv_qdepthwise.F32_EXACT``), so float32 holds it exactly in any order: the kernel is
exactly the numba loop's arithmetic.

The loop order is what the numba loop cannot express: per vector of channels, the window's
weight vectors, bias and scale are loaded once and held in registers while the row's pixels
stream past (one load per tap and pixel, not two). ``c`` is a multiple of 8: vectors of 16
channels where the host has AVX-512 (``$TFRT_PY_ISA`` permitting), the 8 left after them
in one ymm vector; vectors of 8 on AVX2 hosts.

``kernel(kh, kw)`` is the numba ExternalFunction (pointers as integers, status 0) for the
windows in ``WINDOWS``; None where there is no llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=
portable`` or the packed kernels are switched off. Built once per process under a lock
(its machine code cached as the packed gemms'); stateless; any thread.
"""

from __future__ import annotations

import os
from typing import Any

from ...concurrency import compiled_gate
from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from .gemm_packed import ENV_ISA, ENV_PACKED_GEMM, IR_HELPERS, counted_loop, wide_vectors

__all__ = ["SYMBOL", "WINDOWS", "build", "describe", "host_forms", "kernel", "widths"]

#: The windows (kh, kw) built, one symbol each.
WINDOWS = ((3, 3), (5, 5), (7, 7))
SYMBOL = "tfrt_py_qdw_f32_{}x{}"  # .format(kh, kw)


def host_forms() -> list[tuple[int, ...]]:
    """Every vector-width form this host runs, widest first: (16, 8) with AVX-512F, (8,)
    with AVX2 and FMA; none elsewhere."""
    import llvmlite.binding as llvm

    if not llvm.get_process_triple().startswith("x86_64"):
        return []
    f = llvm.get_host_cpu_features()
    if not (f.get("avx2") and f.get("fma")):
        return []
    return [(16, 8), (8,)] if f.get("avx512f") else [(8,)]


def widths() -> tuple[int, ...]:
    """The form this process uses: the host's widest, (8,) with ``$TFRT_PY_ISA=avx2``,
    () with ``$TFRT_PY_ISA=portable`` or where the host has none."""
    forms = host_forms()
    isa = os.environ.get(ENV_ISA, "").strip().lower()
    if isa == "portable" or not forms:
        return ()
    return forms[-1] if isa == "avx2" else forms[0]


def build(lanes: tuple[int, ...]) -> Any:
    """The engine holding the module compiled for ``lanes`` (one of ``host_forms()``):
    for tests and benchmarks of a form apart from the process's. Raises what llvmlite
    raises."""
    key = f"qdepthwise_ir|{lanes}"
    return compile_ir_cached(lambda: _RowIR(lanes).text(), key, (__file__, *IR_HELPERS), opt=3)[0]


class _RowIR:
    """The module: one function per window in ``WINDOWS`` for the vector ``lanes``."""

    def __init__(self, lanes: tuple[int, ...]) -> None:
        import llvmlite.ir as ir

        self.ir, self.lanes = ir, lanes
        self.i64, self.i32, self.f32 = ir.IntType(64), ir.IntType(32), ir.FloatType()
        self.mod = ir.Module(name="tfrt_py_qdepthwise")
        fma_t = {n: ir.FunctionType(self.vf(n), [self.vf(n)] * 3) for n in lanes}
        self.fma = {n: ir.Function(self.mod, fma_t[n], name=f"llvm.fma.v{n}f32") for n in lanes}

    def vf(self, n: int) -> Any:
        return self.ir.VectorType(self.f32, n)

    def c(self, v: int) -> Any:
        return self.ir.Constant(self.i64, v)

    def text(self) -> str:
        for kh, kw in WINDOWS:
            self.function(kh, kw)
        text = str(self.mod)
        if max(self.lanes) * 32 > 256:  # the zmm registers
            text = wide_vectors(text, [SYMBOL.format(kh, kw) for kh, kw in WINDOWS])
        return text

    def function(self, kh: int, kw: int) -> None:
        ir = self.ir
        fp, i64 = self.f32.as_pointer(), self.i64
        args = [i64.as_pointer(), i64, i64, i64, fp, fp, fp, fp, ir.IntType(8).as_pointer(), i64]
        fn = ir.Function(self.mod, ir.FunctionType(i64, args), name=SYMBOL.format(kh, kw))
        for a in fn.args:
            if isinstance(a.type, ir.PointerType):
                a.add_attribute("noalias")
        self.fn = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.kh, self.kw = kh, kw
        c = fn.args[1]
        wide = self.lanes[0]
        full = self.b.mul(self.b.sdiv(c, self.c(wide)), self.c(wide))
        counted_loop(self.b, self.c(0), full, wide, lambda off: self.channels(off, wide),
                     whole=False)  # fmt: skip
        if len(self.lanes) > 1:  # the 8 channels left after the vectors of 16
            narrow = self.lanes[1]
            tail, after = fn.append_basic_block(), fn.append_basic_block()
            self.b.cbranch(self.b.icmp_signed("<", full, c), tail, after)
            self.b.position_at_end(tail)
            self.channels(full, narrow)
            self.b.branch(after)
            self.b.position_at_end(after)
        self.b.ret(self.c(0))

    def vec(self, base: Any, at: Any, n: int) -> Any:
        b = self.b
        return b.load(b.bitcast(b.gep(base, [at]), self.vf(n).as_pointer()), align=4)

    def splat(self, value: Any, n: int) -> Any:
        b, ir = self.b, self.ir
        e = b.insert_element(ir.Constant(self.vf(n), ir.Undefined), value,
                             ir.Constant(self.i32, 0))  # fmt: skip
        return b.shuffle_vector(e, ir.Constant(self.vf(n), ir.Undefined),
                                ir.Constant(ir.VectorType(self.i32, n), [0] * n))  # fmt: skip

    def channels(self, off: Any, n: int) -> None:
        """The row's pixels for the ``n`` channels from ``off``: the window's weights, bias
        and scale loaded once, then per pixel the taps' multiply-adds and the requantize."""
        b, c = self.b, self.c
        rows, ch, dj, step, w, bias, scale, params, out, n_ow = self.fn.args
        fp = self.f32.as_pointer()
        xs = [b.inttoptr(b.load(b.gep(rows, [c(i)])), fp) for i in range(self.kh)]
        taps = [self.vec(w, b.add(b.mul(c(t), ch), off), n) for t in range(self.kh * self.kw)]
        bv, sv = self.vec(bias, off, n), self.vec(scale, off, n)
        lo, hi, zp = (self.splat(b.load(b.gep(params, [c(k)])), n) for k in range(3))
        magic = self.ir.Constant(self.vf(n), [12582912.0] * n)  # 1.5 * 2**23: half to even
        offs = [b.mul(c(j), dj) for j in range(self.kw)]
        vi = self.ir.VectorType(self.i32, n)
        vb = self.ir.VectorType(self.ir.IntType(8), n)

        def pixel(ow: Any) -> None:
            at = b.add(b.mul(ow, step), off)
            # a chain per row of the window (short dependency chains), then their sum
            chains = []
            for i in range(self.kh):
                acc = bv if i == 0 else None
                for j in range(self.kw):
                    t = i * self.kw + j
                    x = self.vec(xs[i], b.add(at, offs[j]), n)
                    acc = (
                        b.fmul(taps[t], x)
                        if acc is None
                        else b.call(self.fma[n], [taps[t], x, acc])
                    )
                chains.append(acc)
            while len(chains) > 1:
                chains = [b.fadd(chains[k], chains[k + 1]) if k + 1 < len(chains) else chains[k]
                          for k in range(0, len(chains), 2)]  # fmt: skip
            acc = chains[0]
            f = b.fmul(acc, sv)
            f = b.select(b.fcmp_ordered("<", f, lo), lo, f)
            f = b.select(b.fcmp_ordered(">", f, hi), hi, f)
            f = b.fadd(b.fsub(b.fadd(f, magic), magic), zp)
            q = b.trunc(b.fptosi(f, vi), vb)
            dst = b.gep(out, [b.add(b.mul(ow, ch), off)])
            b.store(q, b.bitcast(dst, vb.as_pointer()), align=1)

        counted_loop(b, c(0), n_ow, 1, pixel, whole=False)


def _register() -> tuple[str, dict[tuple[int, int], Any], Any]:
    try:
        from numba import types

        lanes = widths()
        if not lanes:
            return "no AVX2 and FMA (or $TFRT_PY_ISA=portable)", {}, None
        engine = build(lanes)
        p, n = types.uintp, types.int64
        fns = {}
        for kh, kw in WINDOWS:
            sym = SYMBOL.format(kh, kw)
            add_symbol(sym, engine.get_function_address(sym))
            fns[kh, kw] = types.ExternalFunction(sym, types.int64(p, n, n, n, p, p, p, p, p, n))
    except Exception as e:  # noqa: BLE001 - no llvmlite JIT here: the numba loop stays
        return f"the kernel did not build: {type(e).__name__}", {}, None
    return f"vectors of {' and '.join(map(str, lanes))} float32", fns, engine


#: (why, {window: ExternalFunction}, engine), decided on first use
_DECIDED: Once[tuple[str, dict[tuple[int, int], Any], Any]] = Once(_register)


def kernel(kh: int, kw: int) -> Any:
    """The ExternalFunction for a ``kh`` x ``kw`` window (signature in the module
    docstring), None where the kernel is off or the window not built."""
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return None
    return _DECIDED.get()[1].get((kh, kw))


def describe() -> str:
    """How the kernel was decided ("" before it was)."""
    got = _DECIDED.peek()
    return got[0] if got else ""
