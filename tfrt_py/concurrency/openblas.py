"""OpenBLAS's thread count through its own C API, without threadpoolctl's library scan.

``threads._single_threaded_blas`` sets every BLAS library in the process to one thread.
threadpoolctl finds them by walking every loaded library (``dl_iterate_phdr``) and costs
~5 ms (2.6 ms to import, 2 ms to scan) in a fresh process, where a small model's whole
``load()`` is ~30 ms. When the BLAS libraries mapped into the process (``/proc/self/maps``)
are all OpenBLAS builds whose entry points are found here -- NumPy's and SciPy's bundled
``scipy_openblas`` and a distribution's ``libopenblas`` -- they are set directly;
anything else (MKL, BLIS, FlexiBLAS, an OpenBLAS without those symbols) returns None and
the caller scans with threadpoolctl.

Not thread-safe by itself: ``threads`` calls it under its lock.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable

__all__ = ["DirectBlas", "direct_blas"]

#: The symbol spellings of OpenBLAS builds (threadpoolctl's OpenBLASController tries
#: these): plain, SciPy's ``scipy_`` prefix, and the ILP64 ``64_`` / ``_64`` suffixes.
_PREFIXES = ("", "scipy_")
_SUFFIXES = ("", "64_", "_64")
#: The file names of the OpenBLAS builds driven here (threadpoolctl's prefixes for it,
#: less the generic ``libblas``, which may be any BLAS).
_OPENBLAS = ("libopenblas", "libscipy_openblas")
#: BLAS libraries of a GPU (torch's CUDA wheels map cuBLAS into the process; ROCm's
#: rocBLAS and hipBLAS): no CPU threads to set, and no threadpoolctl controller for them.
_GPU_BLAS = ("libcublas", "librocblas", "libhipblas")


class _Library:
    """One OpenBLAS library's ``num_threads``, as threadpoolctl's controllers have it."""

    def __init__(self, path: str, get: Callable[[], int], set_: Callable[[int], None]) -> None:
        self.filepath = path
        self._get = get
        self._set = set_

    @property
    def num_threads(self) -> int:
        return int(self._get())

    def set_num_threads(self, n: int) -> None:
        self._set(n)


class DirectBlas:
    """The part of threadpoolctl's ``ThreadpoolController`` that ``threads`` uses:
    ``lib_controllers`` and ``limit(limits=n)``."""

    def __init__(self, libs: list[_Library]) -> None:
        self.lib_controllers = libs

    def limit(self, limits: int) -> None:
        for lib in self.lib_controllers:
            lib.set_num_threads(limits)


def _entry(lib: ctypes.CDLL) -> tuple[Callable[[], int], Callable[[int], None]] | None:
    for prefix in _PREFIXES:
        for suffix in _SUFFIXES:
            get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return get, set_
    return None


def direct_blas(mapped: Iterable[bytes]) -> DirectBlas | None:
    """Controllers for ``mapped`` (the BLAS-like library paths in the process: files
    named ``lib*``; others, such as extension modules linked to a BLAS, and a GPU's BLAS
    are passed over), or None when one of them is not an OpenBLAS this module can
    drive."""
    libs = []
    for raw in sorted(mapped):
        path = os.fsdecode(raw)
        name = os.path.basename(path).lower()
        if not name.startswith("lib"):
            continue  # an extension module linked to a BLAS (SciPy's _fblas), not one
        if name.startswith(_GPU_BLAS):
            continue  # a GPU's BLAS: threadpoolctl passes it over too
        if not name.startswith(_OPENBLAS):
            return None
        try:
            lib = ctypes.CDLL(path)  # already mapped: the loader hands back its handle
        except OSError:
            return None
        found = _entry(lib)
        if found is None:
            return None
        libs.append(_Library(path, *found))
    return DirectBlas(libs) if libs else None
