"""The CPU's kernel paths, and the one this process takes (as MLAS dispatches).

``host_paths()``: the paths this host runs, widest first -- ``avx512`` (AVX-512F with AVX2
and FMA), ``avx2`` (AVX2 and FMA), ``neon`` (aarch64), ``portable`` (always).
``choose()``: ``$TFRT_PY_ISA`` when the host has it, else the widest. The packed gemm
(``kernels/lib/gemm_packed``) builds its tile for that path and numba's loops take its
vector width (``numba_target``). Reads llvmlite's view of the host (imports
``llvmlite.binding``); pure functions, any thread.
"""

from __future__ import annotations

import os

__all__ = ["ENV_ISA", "choose", "host_paths"]

#: ``TFRT_PY_ISA=avx512|avx2|neon|portable``: the kernel path, when the host has it (read
#: once, when a kernel is first built); portable: no packed kernel, NumPy's gemm.
ENV_ISA = "TFRT_PY_ISA"


def host_paths() -> list[str]:
    """The kernel paths this host runs, widest first (``portable`` always)."""
    import llvmlite.binding as llvm

    triple = llvm.get_process_triple()
    if triple.startswith("aarch64"):
        return ["neon", "portable"]  # NEON: fma and two registers per vector
    if not triple.startswith(("x86_64", "i386", "i686")):
        return ["portable"]
    feats = llvm.get_host_cpu_features()
    out = []
    if feats.get("avx2") and feats.get("fma"):
        if feats.get("avx512f"):
            out.append("avx512")
        out.append("avx2")
    return [*out, "portable"]


def choose() -> tuple[str, str]:
    """(path, why): ``$TFRT_PY_ISA`` when the host has it, else the host's widest."""
    have = host_paths()
    asked = os.environ.get(ENV_ISA, "").strip().lower()
    if asked and asked in have:
        return asked, f"${ENV_ISA}={asked}"
    why = "the host's widest"
    if asked:
        why = f"${ENV_ISA}={asked} is not a path of this host ({', '.join(have)})"
    return have[0], why
