"""NumPy's own BLAS ``gemm`` and ``gemv``, callable from compiled kernels.

numba's ``np.dot`` calls SciPy's BLAS, needs contiguous operands, and on this machine
SciPy's OpenBLAS build was 1.1-1.9x slower than NumPy's for a conv's wide products (16x144
@ 144x6272: 751 µs vs 394). Kernels that split a product over native threads call
NumPy's ``cblas_?gemm`` instead, through two symbols registered with LLVM here:
``tfrt_py_sgemm`` and ``tfrt_py_dgemm`` (row-major, leading dimensions given, so a block
of a larger array is an operand as it is). ``register(mod)`` registers them (once per
process; a cached kernel needs them before it loads, so ``Jitted(prepare=...)`` calls it)
and sets the kernel module's globals ``_sgemm`` and ``_dgemm``: numba ``ExternalFunction``
types over ``(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)``,
pointers passed as addresses (``arr.ctypes.data``); likewise ``_sgemv``/``_dgemv`` over
``(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy)`` (a product of one row:
gemm with one row packs the matrix for nothing, gemv streams it).

NumPy's BLAS is the library threadpoolctl finds inside NumPy's install (the wheels'
``scipy_cblas_?gemm64_``: 64-bit integers; a ``cblas_?gemm`` without the suffix: 32-bit).
Where there is none (another BLAS arrangement), ``register`` returns False and the
kernels keep their other path. Thread-safe: registration happens once under a lock.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

__all__ = ["available", "register"]

_LOCK = threading.Lock()
_DONE: list[Any] = []  # [(sgemm, dgemm, sgemv, dgemv types)] once registered, [None]: impossible
_FOUND: list[bool] = []  # [whether NumPy's BLAS has a gemm] once looked
#: (symbol suffix, integer width in bits), tried in this order in NumPy's BLAS library
_NAMES = (("scipy_cblas_{}64_", 64), ("cblas_{}64_", 64), ("cblas_{}", 32))


def register(module_globals: dict[str, Any]) -> bool:
    """Register the gemm and gemv symbols and set ``_sgemm``/``_dgemm``/``_sgemv``/
    ``_dgemv`` in ``module_globals``; False when NumPy's BLAS cannot be found (nothing
    set)."""
    with _LOCK:
        if not _DONE:
            _DONE.append(_register())
        types = _DONE[0]
    if types is None:
        return False
    for name, t in zip(("_sgemm", "_dgemm", "_sgemv", "_dgemv"), types, strict=True):
        module_globals[name] = t
    return True


def available() -> bool:
    """Whether NumPy's BLAS exports a gemm ``register`` can bind (checked with ctypes,
    without importing numba; cached)."""
    with _LOCK:
        if not _FOUND:
            _FOUND.append(_find() is not None)
        return bool(_FOUND[0])


def _find() -> tuple[list[Any], int] | None:
    """([sgemm, dgemm, sgemv, dgemv], integer bits) from NumPy's BLAS library, or None."""
    path = _numpy_blas_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for pattern, bits in _NAMES:
        try:
            fns = [getattr(lib, pattern.format(c + k)) for k in ("gemm", "gemv") for c in "sd"]
        except AttributeError:
            continue
        return fns, bits
    return None


def _numpy_blas_path() -> str | None:
    import numpy
    import threadpoolctl

    from ...concurrency.threads import under_import_lock

    root = os.path.dirname(os.path.dirname(os.path.abspath(numpy.__file__)))
    for info in under_import_lock(threadpoolctl.threadpool_info):
        path = info.get("filepath") or ""
        if (
            info.get("user_api") == "blas"
            and os.path.basename(os.path.dirname(path)).startswith(("numpy", ".dylibs"))
            and os.path.abspath(path).startswith(root)
        ):
            return str(path)
    return None


def _register() -> Any:
    try:
        import llvmlite.binding as llvm
        import numba

        types: Any = numba.types
    except Exception:  # noqa: BLE001 - no numba: no compiled kernels at all
        return None
    found = _find()
    if found is None:
        return None
    fns, bits = found
    n = types.int64 if bits == 64 else types.int32
    i32, p = types.int32, types.uintp
    out = []
    for name, fn, f in zip(
        ("sgemm", "dgemm", "sgemv", "dgemv"), fns, (types.float32, types.float64) * 2,
        strict=True,
    ):  # fmt: skip
        llvm.add_symbol(f"tfrt_py_{name}", ctypes.cast(fn, ctypes.c_void_p).value)
        if name.endswith("gemm"):
            sig = types.void(i32, i32, i32, n, n, n, f, p, n, p, n, f, p, n)
        else:
            sig = types.void(i32, i32, n, n, f, p, n, p, n, f, p, n)
        out.append(types.ExternalFunction(f"tfrt_py_{name}", sig))
    return tuple(out)
