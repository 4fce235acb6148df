"""The dynamic int8 product in generated native code (issue 36): DynamicQuantizeLinear and
com.microsoft MatMulIntegerToFloat, as ``onnxruntime.quantization.quantize_dynamic`` writes
them (after ``compiler/fuse_dynamic_quant``), with the interpreter's bits.

``dql_u8(x, xo, n, y, yo, s, so, z, zo)``: the ``n`` floats of ``x`` from ``xo`` quantized
to uint8 into ``y`` from ``yo``, their scale into ``s[so]`` and zero point into ``z[zo]``:
``kernels/lib/quant.dynamic_quantize``'s arithmetic (its compiled path's steps where every
value is finite; its NumPy path's where one is NaN or infinite: the range then counts a
NaN as nothing above or below 0, and a NaN quotient's code is 0).

``qmm_u8(a, ao, m, k, w, colsum, wz, scale, bias, s, so, z, zo, has_z, y, yo, n, stage,
rows, wide, ldy, kp, kg, panels, layout, vnni, asymmetric)``: ``y[yo + r * n + c]`` = the
product of ``m`` rows of uint8 codes (``k`` from ``ao + r * k``, zero point ``z[zo]`` when
``has_z``) by the weight packed at lowering for this process's ``qgemm_packed`` path (``w``:
its bytes as int32 words), scaled by ``s[so] * scale[c]`` plus ``bias[c]`` as
``IntegerWeights.product_scaled`` stores them (``colsum``, ``wz``, ``scale``, ``bias``
padded to the panels' columns, as it makes them). A's rows go to the kernel in place when
they are its layout (VNNI, ``k == kp``), else through ``stage`` (bytes: ``m * kp`` codes, as
int16 on the widening paths); ``rows`` (m int32) takes the row terms of a weight with zero
points; ``wide`` (``m * ldy`` floats, ``ldy`` N rounded up to whole vectors, as the
lowering sizes it) the rows when ``n`` is not a whole number of vectors. ValueError when
the weight was packed for another path. Stateless; any thread; the caller sizes the
scratch.

Importing this module builds (or loads) the scaled kernel and registers its symbol before
numba compiles a function that calls it; where it is off it raises ImportError, and the
lowering, which asks first, declines.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...kernels.lib import qgemm_packed
from .closure_cache import stamp_with_siblings

__all__ = ["dql_u8", "qmm_u8"]

qgemm_scaled = qgemm_packed.kernel_scaled()
if qgemm_scaled is None:
    raise ImportError(f"the integer kernels are off here ({qgemm_packed.path()[1]})")


@njit(nogil=True, cache=True)
def _zero_point(minx, scale):  # pragma: no cover - compiled
    """The zero point, as Python's ``min(255, max(0, q))`` then ``rint`` make it (a NaN
    ``q`` gives 0)."""
    q = np.float64(np.float32(np.float32(0) - np.float32(minx / scale)))
    v = q if q > 0.0 else 0.0
    v = v if v < 255.0 else 255.0
    return np.float32(np.rint(v))


@njit(nogil=True, cache=True)
def dql_u8(x, xo, n, y, yo, s, so, z, zo):  # pragma: no cover - compiled
    # the range on the bits first (``quant._dynamic``'s loop, which vectorizes without
    # fast-math): a positive float's bits order as the float does, and the most negative
    # value has the largest magnitude bits among the sign-set ones
    bits = x[xo : xo + n].view(np.int32)
    tb = np.int32(0)
    nb = np.int32(0)
    mag = np.int32(0x7FFFFFFF)
    for i in range(n):
        b = bits[i]
        tb = b if b > tb else tb
        m = b & mag if b < 0 else np.int32(0)
        nb = m if m > nb else nb
    finite = tb < np.int32(0x7F800000) and nb < np.int32(0x7F800000)
    if finite:  # the bits back to floats through the scale's own slot (no allocation)
        sbits = s.view(np.int32)
        sbits[so] = tb
        top = s[so]
        sbits[so] = nb
        low = -s[so]
    else:  # infinity or NaN: NumPy's max and min, where Python's max(0, NaN) is 0
        top = np.float32(0)
        low = np.float32(0)
        nan = False
        for i in range(n):
            v = x[xo + i]
            if v != v:
                nan = True
            top = v if v > top else top
            low = v if v < low else low
        if nan:
            top = np.float32(0)
            low = np.float32(0)
    scale = np.float32(1.0) if top == low else np.float32(top - low) / np.float32(255)
    zp = _zero_point(low, scale)
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    if finite:  # views from the offsets: indices from 0 need no wraparound, and vectorize
        xs = x[xo : xo + n]
        ys = y[yo : yo + n]
        for i in range(n):
            v = xs[i] / scale  # |v| <= 255 + 1: within the range the scale covers
            v = ((v + magic) - magic) + zp
            ys[i] = min(max(v, np.float32(0)), np.float32(255))
    else:
        for i in range(n):
            v = np.rint(x[xo + i] / scale) + zp
            y[yo + i] = np.uint8(min(max(v, np.float32(0)), np.float32(255))) if v == v else 0
    s[so] = scale
    z[zo] = np.uint8(zp)


@njit(nogil=True, cache=True)
def _stage(a, ao, m, k, kp, dst):  # pragma: no cover - compiled
    """A's ``m`` rows into ``dst`` ``kp`` elements apart, zeros past ``k``."""
    for r in range(m):
        for i in range(k):
            dst[r * kp + i] = a[ao + r * k + i]
        for i in range(k, kp):
            dst[r * kp + i] = 0


@njit(nogil=True, cache=True)
def qmm_u8(a, ao, m, k, w, colsum, wz, scale, bias, s, so, z, zo, has_z, y, yo, n, stage,
           rows, wide, ldy, kp, kg, panels, layout, vnni,
           asymmetric):  # pragma: no cover  # fmt: skip
    zx = np.int64(z[zo]) if has_z else np.int64(0)
    if vnni and kp == k:
        ptr = a.ctypes.data + ao
    else:
        if vnni:
            _stage(a, ao, m, k, kp, stage)
        else:  # the widening paths take A as int16
            _stage(a, ao, m, k, kp, stage.view(np.int16))
        ptr = stage.ctypes.data
    for r in range(m):
        t = np.int64(0)
        if asymmetric:
            for i in range(k):
                t += np.int64(a[ao + r * k + i])
            t -= k * zx
        rows[r] = np.int32(t)
    out = y.ctypes.data + yo * 4 if ldy == n else wide.ctypes.data
    st = qgemm_scaled(ptr, kp, w.ctypes.data, out, ldy, m, kg, panels, layout,
                      colsum.ctypes.data, wz.ctypes.data, rows.ctypes.data, scale.ctypes.data,
                      bias.ctypes.data, s.ctypes.data + so * 4, zx, n)  # fmt: skip
    if st != 0:
        raise ValueError("integer weights packed for another path")
    if ldy != n:
        for r in range(m):
            for c in range(n):
                y[yo + r * n + c] = wide[r * ldy + c]


stamp_with_siblings(globals())
