"""LLVM IR kernels compiled for a named x86-64 CPU, and their loops' register spills: a
build can be checked for a CPU the test host is not (Zen 3's sixteen ymm registers on an
AVX-512 host, whose 32 hide a spill)."""

from __future__ import annotations

import re

import pytest

#: A ymm register moved to or from the stack (a spill or its reload).
_YMM_STACK = re.compile(r"vmov\w*\s+(%ymm\d+, -?\w*\(%rsp\)|-?\w*\(%rsp\), %ymm\d+)")


def fma_loops(ir_text: str, cpu: str = "znver3") -> list[tuple[int, int]]:
    """(fused multiply-adds, ymm stack moves) of each loop of ``ir_text``'s code for ``cpu``
    that multiply-adds: a block that branches back to itself. Skips the test where llvmlite
    is missing or the host's LLVM target is not x86-64."""
    llvm = pytest.importorskip("llvmlite.binding", reason="the kernels are llvmlite IR")
    if not llvm.get_process_triple().startswith("x86_64"):
        pytest.skip("emits x86-64 code (this host's LLVM target is another)")
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    asm = target.create_target_machine(cpu=cpu, opt=3).emit_assembly(llvm.parse_assembly(ir_text))
    loops = []
    for block in re.split(r"\n(?=\.LBB\d+_\d+:)", asm):
        label = block.split(":", 1)[0]
        if f"\t{label}" in block and "vfmadd" in block:
            loops.append((block.count("vfmadd"), len(_YMM_STACK.findall(block))))
    return loops
