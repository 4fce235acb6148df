"""A 256-entry byte table applied to a run of bytes, 64 at a time: ``y[i] = table[x[i]]``,
the LLVM IR kernel under QTable (a quantized SiLU) and QLinearSigmoid/LeakyRelu's lookups.

Where the CPU has AVX-512 VBMI (Ice Lake, Zen 4 and later), the table lives in four zmm
registers and each vector of 64 codes is looked up with two ``vpermi2b`` (the table's halves,
indexed by the codes' low 7 bits) and one byte blend on the codes' top bit: a few
instructions per 64 bytes where a scalar loop takes one load per byte. The codes past the
last whole vector go one by one. Elsewhere (no VBMI, ``$TFRT_PY_ISA`` other than avx512,
no llvmlite JIT, the packed kernels switched off) ``kernel()`` is None and the numba loop
of ``contrib/quantized_elementwise`` stays.

``kernel()``: the numba ExternalFunction ``(x, table, y, n) -> 0`` (addresses as integers;
``x`` and ``y`` may be the same bytes). Built once per process under a lock (its machine
code cached as the packed gemms'); stateless; any thread.
"""

from __future__ import annotations

import os
from typing import Any

from ...concurrency import compiled_gate
from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from .gemm_packed import ENV_ISA, ENV_PACKED_GEMM, IR_HELPERS, counted_loop, wide_vectors

__all__ = ["SYMBOL", "build", "describe", "host_has_vbmi", "kernel"]

SYMBOL = "tfrt_py_qlookup_vbmi"


def host_has_vbmi() -> bool:
    """Whether this host runs the kernel: x86-64 with AVX-512BW and VBMI."""
    import llvmlite.binding as llvm

    if not llvm.get_process_triple().startswith("x86_64"):
        return False
    f = llvm.get_host_cpu_features()
    return bool(f.get("avx512bw") and f.get("avx512vbmi"))


def _text() -> str:
    import llvmlite.ir as ir

    i8, i64 = ir.IntType(8), ir.IntType(64)
    v64 = ir.VectorType(i8, 64)
    mod = ir.Module(name="tfrt_py_qlookup")
    perm = ir.Function(mod, ir.FunctionType(v64, [v64, v64, v64]),
                       name="llvm.x86.avx512.vpermi2var.qi.512")  # fmt: skip
    fn = ir.Function(mod, ir.FunctionType(i64, [i8.as_pointer(), i8.as_pointer(),
                     i8.as_pointer(), i64]), name=SYMBOL)  # fmt: skip
    x, table, y, n = fn.args
    table.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(v: int) -> Any:
        return ir.Constant(i64, v)

    def vec(base: Any, at: Any) -> Any:
        return b.bitcast(b.gep(base, [at]), v64.as_pointer())

    t = [b.load(vec(table, c(64 * q)), align=1) for q in range(4)]
    full = b.mul(b.sdiv(n, c(64)), c(64))

    def vector(i: Any) -> None:  # 64 codes: each table half by its 7 low bits, the top bit picks
        codes = b.load(vec(x, i), align=1)
        lo = b.call(perm, [t[0], codes, t[1]])
        hi = b.call(perm, [t[2], codes, t[3]])
        top = b.icmp_signed("<", codes, ir.Constant(v64, [0] * 64))
        b.store(b.select(top, hi, lo), vec(y, i), align=1)

    def one(j: Any) -> None:  # the codes past the last whole vector, one by one
        code = b.zext(b.load(b.gep(x, [j])), i64)
        b.store(b.load(b.gep(table, [code])), b.gep(y, [j]))

    counted_loop(b, c(0), full, 64, vector, whole=False)
    counted_loop(b, full, n, 1, one, whole=False)
    b.ret(c(0))
    return wide_vectors(str(mod), [SYMBOL])


def build() -> Any:
    """The engine holding the compiled kernel (a host with VBMI): for tests. Raises what
    llvmlite raises."""
    return compile_ir_cached(_text, f"qlookup_ir|{SYMBOL}", (__file__, *IR_HELPERS), opt=3)[0]


def _register() -> tuple[str, Any, Any]:
    try:
        from numba import types

        isa = os.environ.get(ENV_ISA, "").strip().lower()
        if isa in ("avx2", "portable"):
            return f"${ENV_ISA}={isa}", None, None
        if not host_has_vbmi():
            return "no AVX-512 VBMI", None, None
        engine = build()
        add_symbol(SYMBOL, engine.get_function_address(SYMBOL))
        p = types.uintp
        fn = types.ExternalFunction(SYMBOL, types.int64(p, p, p, types.int64))
    except Exception as e:  # noqa: BLE001 - no llvmlite JIT here: the numba loop stays
        return f"the kernel did not build: {type(e).__name__}", None, None
    return "AVX-512 VBMI", fn, engine


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
