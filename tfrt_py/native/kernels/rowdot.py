"""Kernels of a decode step's attention for generated native code: the scores of one or a
few query rows (``q @ K^T``, ``ops_dec.py``), a row's softmax and its product with the
values (``softmax_rows_f4``, ``ops_gqa.py``), and the copy of a past into the buffer of a
KV cache written in place (``lower/cache.py``).

``dot_rows_f4(a, ao, b, bo, c, co, n, k, alpha)``: ``c[co + i] = alpha * a[ao:ao + k] .
b[bo + i*k : bo + i*k + k]`` for ``i < n`` (flat float32 arrays, element offsets). BLAS's
gemm at one query row packs the whole of ``b`` first (a copy of the cache per head per
step: 4-5x this loop's time at 513 rows of 64). The sums are reassociated (``fastmath``
``reassoc``: vector lanes, then a horizontal add), so they round differently from a
sequential sum, as BLAS's do; NaN and infinities propagate (no ``nnan``/``ninf``).
Four rows a step share each load of ``a``. Stateless; any thread; the caller checks the
bounds (the generated code's offsets are its own).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .closure_cache import stamp_with_siblings
from .fastmath import expf_neg

__all__ = ["copy_past_f4", "dot_rows_f4", "softmax_rows_f4"]


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def dot_rows_f4(a, ao, b, bo, c, co, n, k, alpha):  # pragma: no cover - compiled
    s = np.float32(alpha)
    a0 = np.uint64(ao)
    i = 0
    while i + 4 <= n:
        r = np.uint64(bo + i * k)
        kk = np.uint64(k)
        s0 = s1 = s2 = s3 = np.float32(0.0)
        for j in range(k):
            x = a[a0 + np.uint64(j)]
            s0 += x * b[r + np.uint64(j)]
            s1 += x * b[r + kk + np.uint64(j)]
            s2 += x * b[r + np.uint64(2) * kk + np.uint64(j)]
            s3 += x * b[r + np.uint64(3) * kk + np.uint64(j)]
        o = np.uint64(co + i)
        c[o] = s0 * s
        c[o + np.uint64(1)] = s1 * s
        c[o + np.uint64(2)] = s2 * s
        c[o + np.uint64(3)] = s3 * s
        i += 4
    while i < n:
        r = np.uint64(bo + i * k)
        s0 = np.float32(0.0)
        for j in range(k):
            s0 += a[a0 + np.uint64(j)] * b[r + np.uint64(j)]
        c[np.uint64(co + i)] = s0 * s
        i += 1


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def softmax_rows_f4(w, wo, n, v, vo, k, y, yo):  # pragma: no cover - compiled
    """``w[wo:wo + n]`` (one query row's scores) softmaxed in place, then ``y[yo:yo + k] =
    sum_j w[wo + j] * v[vo + j*k : vo + j*k + k]`` (the row's attention output over ``n``
    value rows of ``k``). Sums reassociated (vector lanes), four value rows a step; the
    exponentials by ``fastmath.expf_neg``; NaN propagates."""
    w0 = np.uint64(wo)
    mx = np.float32(-np.inf)
    for j in range(n):
        x = w[w0 + np.uint64(j)]
        if x > mx:
            mx = x
    tot = np.float32(0.0)
    for j in range(n):
        e = expf_neg(w[w0 + np.uint64(j)] - mx)
        w[w0 + np.uint64(j)] = e
        tot += e
    inv = np.float32(1.0) / tot
    y0 = np.uint64(yo)
    kk = np.uint64(k)
    for d in range(k):
        y[y0 + np.uint64(d)] = np.float32(0.0)
    j = 0
    while j + 4 <= n:
        p0 = w[w0 + np.uint64(j)] * inv
        p1 = w[w0 + np.uint64(j + 1)] * inv
        p2 = w[w0 + np.uint64(j + 2)] * inv
        p3 = w[w0 + np.uint64(j + 3)] * inv
        r = np.uint64(vo + j * k)
        for d in range(k):
            dd = np.uint64(d)
            y[y0 + dd] += (p0 * v[r + dd] + p1 * v[r + kk + dd]
                           + p2 * v[r + np.uint64(2) * kk + dd]
                           + p3 * v[r + np.uint64(3) * kk + dd])  # fmt: skip
        j += 4
    while j < n:
        pj = w[w0 + np.uint64(j)] * inv
        r = np.uint64(vo + j * k)
        for d in range(k):
            y[y0 + np.uint64(d)] += pj * v[r + np.uint64(d)]
        j += 1


@intrinsic
def _voidptr(typingctx, addr):  # pragma: no cover - compiled
    """The integer address ``addr`` as a ``void*`` (for ``numba.carray``)."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(addr), codegen


@njit(nogil=True, cache=True)
def copy_past_f4(a, c):  # pragma: no cover - compiled
    """``c[:, :, :P] = a`` for a float32 past ``a`` [B, H, P, D] of any strides (a view of a
    longer buffer, or an array of its own) into ``c`` [B, H, T >= P, D], C-ordered: each
    row of ``D`` read as one contiguous run where ``a``'s last stride is one element (a
    NumPy-speed copy; the element-wise loop over a strided ``'A'`` array does not
    vectorize and ran at a third of it). Negative or partial-element strides take that
    element-wise loop."""
    n0, n1, n2, n3 = a.shape
    if a.size == 0:
        return
    s0, s1, s2, s3 = a.strides
    if min(s0, s1, s2, s3) < 0 or (s0 | s1 | s2 | s3) % 4:
        for i0 in range(n0):
            for i1 in range(n1):
                for i2 in range(n2):
                    for i3 in range(n3):
                        c[i0, i1, i2, i3] = a[i0, i1, i2, i3]
        return
    s0, s1, s2, s3 = s0 // 4, s1 // 4, s2 // 4, s3 // 4
    extent = (n0 - 1) * s0 + (n1 - 1) * s1 + (n2 - 1) * s2 + (n3 - 1) * s3 + 1
    src = carray(_voidptr(a.ctypes.data), (extent,), np.float32)  # type: ignore[call-arg]
    dst = c.reshape(c.size)
    t = c.shape[2]
    for i0 in range(n0):
        for i1 in range(n1):
            for i2 in range(n2):
                so = np.uint64(i0 * s0 + i1 * s1 + i2 * s2)
                do = np.uint64(((i0 * n1 + i1) * t + i2) * n3)
                if s3 == 1:
                    for i3 in range(n3):
                        dst[do + np.uint64(i3)] = src[so + np.uint64(i3)]
                else:
                    for i3 in range(n3):
                        dst[do + np.uint64(i3)] = src[so + np.uint64(i3 * s3)]


@njit(nogil=True, cache=True)
def cache_misfit_f4(c, v, b, h, s, d):  # pragma: no cover - compiled
    """Whether the float32 buffer ``c`` [B', H, T, D] cannot take a present [b, h, s, d]
    with ``v`` the present's view the caller passed (``Model.run(outputs=)``): ``c`` has
    fewer rows or positions, another size on a head or feature axis, or ``v`` is not its
    prefix of that shape. ``lower/cache.cache_prologue`` calls it once a cache (the
    comparisons written out, eight caches' cost a decoder's box ~2.5 s of numba's front
    end); the dims come as int64."""
    if c.shape[0] < b or c.shape[1] != h or c.shape[3] != d or c.shape[2] < s:
        return True
    if v.shape[0] != b or v.shape[1] != h or v.shape[2] != s or v.shape[3] != d:
        return True
    return v.ctypes.data != c.ctypes.data or v.strides != c.strides


stamp_with_siblings(globals())
