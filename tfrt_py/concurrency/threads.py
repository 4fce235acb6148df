"""How many threads this process computes with: ``set_process_threads(n)``.

A machine running several tfrt_py processes (pre-forked server workers, Ray actors) must
not give each of them every core: N workers with N BLAS threads each oversubscribe the
cores N-fold and every call slows down (docs/serving.md measured 35x for OpenBLAS threads
under load). ``set_process_threads(n)`` sets, for the calling process:

* the BLAS libraries already loaded (OpenBLAS, NumPy's bundled ``scipy_openblas`` and MKL,
  found in ``/proc/self/maps`` and called through their ``*_set_num_threads``), which read
  their environment only once, when NumPy is imported;
* the environment (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``,
  ``NUMBA_NUM_THREADS`` and ``TFRT_PY_THREADS``) for libraries loaded later and for
  subprocesses;
* the worker count of tfrt_py's default ``HostContext`` when its workers have not started
  (they start on first use; a forked child's restart on first use, see ``host``).

Call it early in the process it configures (a forked worker right after the fork, an
actor in its constructor), from one thread. Pure ctypes and ``os``: no NumPy needed.
"""

from __future__ import annotations

import ctypes
import os
import sys

from .host import _core_count, default_host

__all__ = ["THREAD_ENV", "blas_threads", "cores", "set_process_threads"]

#: Variables ``set_process_threads`` sets (read by libraries that start after it).
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "TFRT_PY_THREADS",
)
_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "MKL_Set_Num_Threads",
)
_GETTERS = (
    "openblas_get_num_threads",
    "openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
    "MKL_Get_Max_Threads",
)


def cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    return _core_count()


def set_process_threads(n: int) -> list[str]:
    """Compute with ``n`` threads in this process (see the module docstring); returns the
    BLAS libraries it set, by file name."""
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    for var in THREAD_ENV:
        os.environ[var] = str(n)
    done = []
    for path, lib in _blas_libraries():
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int]
                fn.restype = None
                fn(n)
                done.append(os.path.basename(path))
                break
    host = default_host()
    if not host._workers:  # not started yet: the first enqueue starts num_workers threads
        host.num_workers = n
    return done


def blas_threads() -> dict[str, int]:
    """Threads of each loaded BLAS library, by file name (what ``set_process_threads`` set)."""
    out = {}
    for path, lib in _blas_libraries():
        for name in _GETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                out[os.path.basename(path)] = int(fn())
                break
    return out


def _blas_libraries() -> list[tuple[str, ctypes.CDLL]]:
    """The BLAS shared libraries this process has loaded (Linux: ``/proc/self/maps``)."""
    if not sys.platform.startswith("linux"):
        return []
    paths: dict[str, None] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            path = parts[5].strip() if len(parts) > 5 else ""
            base = os.path.basename(path).lower()
            if ".so" in base and ("openblas" in base or "libmkl_rt" in base):
                paths[path] = None
    libs = []
    for path in paths:
        try:
            libs.append((path, ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)))
        except OSError:
            continue  # not loadable by name (deleted, or not a library after all)
    return libs
