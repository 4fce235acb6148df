"""Which fast paths this process runs, and why any is off: one table for ``describe()``
and ``tfrt-py inspect``.

``features()`` reads what is already decided and starts nothing: no numba import, no
thread layer, no kernel build. A path decided on first use (the native threads, the
packed gemm) reads "not yet" until a kernel has asked for it; the CPU's vector features
come from ``/proc/cpuinfo`` (Linux), else llvmlite when numba has already loaded it.

The CPU features are the ones kernels dispatch on: AVX-512F, AVX2 and FMA (the packed
gemm's micro-tile: its line names the path, ``gemm_packed``; numba's vectorized loops:
512-bit vectors on the avx512 path, the numba line says, ``numba_target``), AVX-512 VNNI
and AVX-VNNI (the integer kernel's paths: its line names the one chosen, ``qgemm_packed``,
whether its products run on AMX tiles, ``qgemm_amx``, and the depthwise row kernel's
vector widths, ``qdepthwise_ir``; the max pool's, ``pool_ir``, the stem convs',
``stem_ir``, and the linear models' rows', ``linear_rows_ir``, on the packed gemm's line).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import NamedTuple

from ...concurrency import native_pool, native_threads, numba_target
from ...concurrency.env_switch import switched_off
from . import (
    gemm_packed,
    linear_rows_ir,
    pool_ir,
    qdepthwise_ir,
    qgemm_amx,
    qgemm_packed,
    qnbits_ir,
    stem_ir,
)
from .jit import why_off

__all__ = ["Feature", "cpu_flags", "features", "format_features"]

#: CPU feature -> how /proc/cpuinfo and LLVM spell it.
_CPU = {
    "AVX2": ("avx2", "avx2"),
    "FMA": ("fma", "fma"),
    "AVX-512F": ("avx512f", "avx512f"),
    "AVX-512 VNNI": ("avx512_vnni", "avx512vnni"),
    "AVX-VNNI": ("avx_vnni", "avxvnni"),
}


class Feature(NamedTuple):
    """One fast path: ``on`` True, False, or None (decided on first use, not yet)."""

    name: str
    on: bool | None
    why: str


def cpu_flags() -> dict[str, bool]:
    """The vector features of ``_CPU`` this CPU has (empty when it cannot be read without
    importing llvmlite)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return {name: spell[0] in have for name, spell in _CPU.items()}
    except OSError:
        pass
    if "llvmlite.binding" in sys.modules:
        feats = sys.modules["llvmlite.binding"].get_host_cpu_features()
        return {name: bool(feats.get(spell[1])) for name, spell in _CPU.items()}
    return {}


def _numba() -> Feature:
    off = why_off()
    if off:
        return Feature("numba kernels", False, off)
    numba = sys.modules.get("numba")
    version = f"numba {numba.__version__}" if numba is not None else "numba (not loaded yet)"
    width = numba_target.state()
    return Feature("numba kernels", True, f"{version}; {width}" if width else version)


def _threads() -> list[Feature]:
    on, why = native_threads.state()
    layer = Feature("native threads (TBB)", on, why or "split kernels' parts off the GIL")
    if native_pool.installed():
        pool = Feature("native pool", True, f"futex-sleeping workers: {native_pool.workers()}")
    elif on:
        pool = Feature("native pool", False, native_pool.declined() or "not installed")
    else:
        pool = Feature("native pool", on, "runs once the native threads do")
    return [layer, pool]


def _packed() -> Feature:
    if switched_off(gemm_packed.ENV_PACKED_GEMM):
        return Feature("packed gemm", False, f"${gemm_packed.ENV_PACKED_GEMM}=0")
    got = gemm_packed.chosen()
    if got is None:
        return Feature("packed gemm", None, "built on the first float32 product that uses it")
    path, why, shape = got
    pools = pool_ir.describe()
    pools = f"; max pools: {pools}" if pools else ""
    stems = stem_ir.describe()
    pools += f"; 3x3/2 stem convs: {stems}" if stems else ""
    rows = linear_rows_ir.describe()
    pools += f"; linear models' rows: {rows}" if rows else ""
    if shape is not None:
        tiles = f"{shape.mr}x{shape.nr} tiles"
        return Feature("packed gemm", True, f"path {path}, {tiles} ({why}); float32 products "
                       f"on weights packed at load; {gemm_packed.origin()}{pools}")  # fmt: skip
    if path == "portable" and why.startswith("the kernel did not build"):
        return Feature("packed gemm", False, f"{why}: needs numba and llvmlite's JIT")
    return Feature("packed gemm", False, f"path {path} ({why}): NumPy's gemm")


def _integer() -> Feature:
    if switched_off(gemm_packed.ENV_PACKED_GEMM):
        return Feature("integer gemm", False, f"${gemm_packed.ENV_PACKED_GEMM}=0")
    nb = qnbits_ir.describe()
    nb = f"; 4-bit x int8 blocks (MatMulNBits accuracy_level=4): {nb}" if nb else ""
    got = qgemm_packed.chosen()
    if got is None:
        return Feature("integer gemm", None, f"built on the first 8-bit product that uses it{nb}")
    path, why = got
    if path == "portable":
        return Feature("integer gemm", False, f"{why}: exact 8-bit products on float BLAS{nb}")
    dw = qdepthwise_ir.describe()
    dw = f"; depthwise rows: {dw}" if dw else ""
    amx = "AMX-INT8 tiles" if qgemm_amx.available() else f"vectors ({qgemm_amx.why()})"
    pairs = ("; weights proved not to saturate vpmaddubsw (7-bit: reduce_range) on pairs256"
             if path == qgemm_packed.PAIRS_HOST else "")  # fmt: skip
    return Feature("integer gemm", True, f"path {path} ({why}); u8 x s8 products on weights "
                   f"packed at load, on {amx}{pairs}{dw}{nb}")  # fmt: skip


def _cpu() -> Feature:
    flags = cpu_flags()
    if not flags:
        return Feature("cpu", None, f"{os.uname().machine}: features not readable")
    have = " ".join(name for name, on in flags.items() if on) or "no AVX2"
    return Feature("cpu", True, f"{os.uname().machine} {have}")


def features() -> list[Feature]:
    """The fast paths of this process, in a fixed order. Starts and imports nothing."""
    return [_cpu(), _numba(), *_threads(), _packed(), _integer(), _scipy()]


def _scipy() -> Feature:
    if importlib.util.find_spec("scipy") is None:
        return Feature("scipy", False, "not installed: the native tier's np.dot needs it")
    return Feature("scipy", True, "the native tier's products call its BLAS")


def format_features(rows: list[Feature] | None = None) -> list[str]:
    """One line a feature: ``name: on|off|not yet (why)``; the CPU's line lists its vector
    features."""
    out = []
    for f in rows if rows is not None else features():
        if f.name == "cpu":
            out.append(f"cpu: {f.why}")
            continue
        word = "not yet" if f.on is None else ("on" if f.on else "off")
        out.append(f"{f.name}: {word}" + (f" ({f.why})" if f.why else ""))
    return out
