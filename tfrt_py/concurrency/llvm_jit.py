"""The one way tfrt_py compiles hand-written LLVM IR: llvmlite's MCJIT, in this process,
no C compiler. Its users are the native pool (``native_pool.ll``) and the packed-weight
gemm kernel (``kernels/lib/gemm_packed.py``).

``compile_ir(ir, host_cpu=...)`` parses and verifies the module, compiles it for this
process's target (with ``host_cpu``, for this CPU's name and features: AVX2, FMA, AVX-512
where present) and returns the engine, which owns the machine code: keep it alive as long
as any address taken from it is called. ``add_symbol`` makes an address callable under a
name from IR compiled later (by this module or by numba, which links through the same
LLVM symbol table). Imports llvmlite only when called; raises whatever llvmlite raises
(callers turn that into "this fast path is off" with a reason). Thread-safety: callers
serialize (each compiles once, under its own lock).
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_symbol", "compile_ir", "ir_text"]


def ir_text(name: str) -> str:
    """The IR source file ``name`` shipped in this package (``concurrency/``), read now."""
    from importlib.resources import files

    return files(__package__).joinpath(name).read_text(encoding="utf-8")


def compile_ir(ir: str, *, host_cpu: bool = False, opt: int = 2) -> Any:
    """``ir`` compiled by MCJIT at optimization level ``opt``: the finalized engine
    (``get_function_address``, ``get_global_value_address``). ``host_cpu``: for this
    CPU's name and features; else the process triple's baseline (code that must run on any
    CPU of the triple, such as the pool's)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    if host_cpu:
        tm = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=opt
        )
    else:
        tm = target.create_target_machine(opt=opt)
    mod = llvm.parse_assembly(ir)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    return engine


def add_symbol(name: str, address: int) -> None:
    """Bind ``name`` to ``address`` for IR compiled from now on (numba's included)."""
    import llvmlite.binding as llvm

    llvm.add_symbol(name, address)
