"""Matrix products for generated native code, on NumPy's own BLAS (``kernels.lib.blas``).

Rows mode lowers a model's tile body (``lower.TILE_ROWS`` rows at once) with these calls
for its big products: the same library, and the same single thread, NumPy uses here, so
the tier's own row splits are the only threads (SciPy's OpenBLAS behind numba's ``np.dot``
starts a thread per core of its own). Importing this module registers the gemm symbols
with LLVM, which a cached module calling them needs before it loads: the generated module
imports it first. ImportError when NumPy's BLAS has no gemm to bind (``lower`` checks
``kernels.lib.blas.available()`` first and writes no tile body then).

``gemm_f4``/``gemm_f8``: ``c[co:co + m*n] = a[ao:ao + m*k] @ b[bo:bo + k*n]``, flat C-order
operands with element offsets. ``gemm_f4_ld``: ``c = alpha * a @ op(b)``, every operand a
strided C-order view (leading dimensions ``lda``/``ldb``/``ldc``, ``b`` read transposed
when ``tb``), for the heads of an attention that live side by side in one projection.
Stateless; any thread.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...kernels.lib import blas
from .closure_cache import stamp_with_siblings

__all__ = ["gemm_f4", "gemm_f4_ld", "gemm_f8"]

if not blas.register(globals()):
    raise ImportError("NumPy's BLAS has no gemm that numba can call")


@njit(nogil=True, cache=True)
def gemm_f4(a, ao, b, bo, c, co, m, k, n):
    pa = a.ctypes.data + np.uint64(ao * 4)
    pb = b.ctypes.data + np.uint64(bo * 4)
    pc = c.ctypes.data + np.uint64(co * 4)
    _sgemm(101, 111, 111, m, n, k, np.float32(1), pa, k, pb, n, np.float32(0), pc, n)  # type: ignore[name-defined]  # noqa: F821


@njit(nogil=True, cache=True)
def gemm_f8(a, ao, b, bo, c, co, m, k, n):
    pa = a.ctypes.data + np.uint64(ao * 8)
    pb = b.ctypes.data + np.uint64(bo * 8)
    pc = c.ctypes.data + np.uint64(co * 8)
    _dgemm(101, 111, 111, m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n)  # type: ignore[name-defined]  # noqa: F821


@njit(nogil=True, cache=True)
def gemm_f4_ld(a, ao, lda, b, bo, ldb, tb, c, co, ldc, m, k, n, alpha):
    pa = a.ctypes.data + np.uint64(ao * 4)
    pb = b.ctypes.data + np.uint64(bo * 4)
    pc = c.ctypes.data + np.uint64(co * 4)
    _sgemm(101, 111, 112 if tb else 111, m, n, k, np.float32(alpha), pa, lda, pb, ldb,  # type: ignore[name-defined]  # noqa: F821
           np.float32(0), pc, ldc)  # fmt: skip


stamp_with_siblings(globals())
