"""numba's loops at the vector width of the host's kernel path: 512 bits on AVX-512.

numba compiles for the host CPU, but LLVM tunes AVX-512 Xeons (skylake-avx512,
cascadelake, icelake-server, sapphirerapids, ...) to prefer 256-bit vectors (the tuning
feature ``prefer-256-bit``), so numba's loops -- every compiled kernel and the native
tier's whole-model functions -- ran in ymm registers where zmm ones exist, while MLAS and
our packed gemm use zmm there. On the ``avx512`` path (``isa.choose()``)
``import_numba()`` gives numba the host's features with ``-prefer-256-bit`` before numba's
CPU target is made. A narrower path forced on an AVX-512 host (``TFRT_PY_ISA=avx2``) gets
``+prefer-256-bit``: LLVM's Zen 4 tuning (znver4) prefers 512-bit vectors, so numba's
default there would put the avx2 path's loops in zmm registers. On a 2-core Xeon (Ice Lake,
AVX-512; one thread, the sync interpreter, batch 1, processes alternating 512/256, three
pairs, medians of 150 calls, ms): EfficientNet-B0 21.7-23.2 / 24.2-30.0, ConvNeXt-Atto
17.9-18.4 / 19.7-20.6, ViT-Tiny 34.7-37.9 / 35.5-45.5, the int8 MobileNetV2 (QDQ)
9.1-9.3 / 10.0-11.2, BERT-2L/128 at 8 x 128 tokens 13.6-13.8 / 15.2-15.7 and at 5 x 100
6.3-6.4 / 6.5-6.8; MobileNetV2, MobileNetV3-small, ResNet-18 and the int8 ResNet-18 and
EfficientNet-B0 moved within the noise (their time is in the packed gemm and OpenBLAS).
The vision zoo at batch 1 against onnxruntime (both at 2 threads, two rounds each):
geomean 1.60-1.61x with 512-bit loops, 1.71x with 256 (EfficientNet-B0 1.53-1.61x /
1.98-2.02x, MobileNetV3-small 1.76-1.86x / 1.99-2.10x).

numba makes its CPU target once per process, at its first compile or cache load, so:

* where that came first (the process's own numba code compiled before tfrt_py's first
  kernel), or ``$NUMBA_CPU_NAME``/``$NUMBA_CPU_FEATURES`` are set, numba's choice stays;
* a user's numba functions compiled later in the process get the wider vectors too, with
  the same results (the width changes no rounding, unless a function asked for
  fast-math reassociation);
* numba's disk cache keys its entries on the features: each width keeps its own.

``state()`` says what was decided. Every tfrt_py site that may compile with numba imports
it through ``import_numba()``; the compile server's child compiles for this process's
``cpu_features()``. Thread-safe (the decision is made once, under a lock).
"""

from __future__ import annotations

import threading
from typing import Any

from . import isa

__all__ = ["NARROW", "NARROW_STATE", "WIDE", "cpu_features", "import_numba", "state"]

#: LLVM's tuning feature that keeps an AVX-512 Xeon's vectorized loops at 256 bits.
NARROW = "prefer-256-bit"
#: ``state()``'s answer when numba's loops take 512-bit vectors.
WIDE = "512-bit vectors (path avx512)"
#: ``state()``'s answer (with the path) when a narrower path is forced on an AVX-512 host.
NARROW_STATE = "256-bit vectors"

_lock = threading.Lock()
_decided: list[str] = []  # [what ``_configure`` did], once it ran


def import_numba() -> Any:
    """numba, imported, its CPU target set up for the host's path if it is not made yet
    (see the module doc). Raises what ``import numba`` raises."""
    import numba

    with _lock:
        if not _decided:
            _decided.append(_configure())
    return numba


def state() -> str | None:
    """What numba's loops take: ``WIDE``, or why not (numba's default width); None before
    tfrt_py imported numba."""
    return _decided[0] if _decided else None


def cpu_features() -> str:
    """The LLVM feature string numba's loops in this process are (or will be) compiled
    for, deciding it first (``import_numba``). The compile server's child is given it
    (``$NUMBA_CPU_FEATURES``), so the machine code it caches is what this process looks
    up: numba keys its cache on the features."""
    import_numba()
    from numba.core import codegen, registry

    config = _config()
    if "_toplevel_target_context" in vars(registry.cpu_target):
        made = getattr(registry.cpu_target.target_context.codegen(), "_tm_features", None)
        if isinstance(made, str):
            return made
    if config.CPU_FEATURES is not None:
        return str(config.CPU_FEATURES)
    return str(codegen.get_host_cpu_features())


def _configure() -> str:
    try:
        from numba.core import codegen, registry

        config = _config()
        if "_toplevel_target_context" in vars(registry.cpu_target):
            return "numba's default: its CPU target was made before tfrt_py's first kernel"
        if config.CPU_NAME is not None or config.CPU_FEATURES is not None:
            return "numba's default: $NUMBA_CPU_NAME/$NUMBA_CPU_FEATURES are set"
        path, _why = isa.choose()
        host = str(codegen.get_host_cpu_features())
        if path == "avx512":
            config.CPU_FEATURES = f"{host},-{NARROW}"
            return WIDE
        if "+avx512f" in host.split(","):  # a narrower path forced on an AVX-512 host
            config.CPU_FEATURES = f"{host},+{NARROW}"  # Zen 4's tuning would take zmm
            return f"{NARROW_STATE} (path {path})"
        return f"numba's default (path {path})"
    except Exception as e:  # noqa: BLE001 - numba's internals moved: keep its default
        return f"numba's default ({type(e).__name__}: {e})"


def _config() -> Any:
    """numba's config module (its settings are module attributes set at import)."""
    from numba.core import config

    return config
