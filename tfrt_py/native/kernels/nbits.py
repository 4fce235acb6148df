"""The weight-only 4/8-bit product of generated native code (com.microsoft MatMulNBits at a
decode step's few rows, ``lower/ops_nbits.py``): the interpreter's GEMV loop
(``kernels/contrib/matmul_nbits._gemv``) over the same panels, on one thread, reading and
writing flat float32 buffers at element offsets.

``nbits_rows_f4(x, xo, m, k, codes, scale, scale_zp, y, yo, n, nibbles, block, int8_a,
scratch)``: for each of ``m`` rows of ``x`` (``k`` floats from ``xo + r * k``), ``y[yo + r *
n + c] = sum_k x[k] * w[k, c]`` with ``w`` the dequantized weight held as ``NBitsWeight``
lays it out (``words``: the bytes of ``codes`` (panels, rows, 64) uint8 as int32 words,
4-bit codes two to a byte when ``nibbles``; ``scale`` and ``scale_zp`` (panels, k_blocks,
64) float32), flat; the codes past ``k`` in the last block meet zeros. Per panel of 64
columns and block, ``d[c] = sum code * x`` unpacked in registers, then ``acc += scale * d -
scale_zp * sum x``: the interpreter's sums in its order. With ``int8_a``
(``accuracy_level=4``) each row is first replaced by what its int8 blocks dequantize to
(onnxruntime's level-4 values; the interpreter's int8 kernel multiplies the same
integers). ``scratch``: float32 from the caller's arena (no allocation per step), ``128 + m
* kp`` elements, ``kp`` K rounded up to the block. Stateless; any thread; the caller checks
the bounds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .closure_cache import stamp_with_siblings

__all__ = ["nbits_rows_f4"]


@njit(nogil=True, cache=True, fastmath={"contract"})
def nbits_rows_f4(
    x, xo, m, k, words, scale, scale_zp, y, yo, n, nibbles, block, int8_a, scratch
):  # pragma: no cover - compiled
    codes = words.view(np.uint8)
    panels = (n + 63) // 64
    k_blocks = (k + block - 1) // block
    kp = k_blocks * block
    rows = kp // 2 if nibbles else kp
    per_blk = rows // k_blocks
    sixteenth = np.float32(0.0625)
    sixteen = np.float32(16.0)
    d = scratch[:64]
    acc = scratch[64:128]
    xs = scratch[128 : 128 + m * kp].reshape((m, kp))  # the rows, zeros past k
    for r in range(m):
        for i in range(k):
            xs[r, i] = x[xo + r * k + i]
        for i in range(k, kp):
            xs[r, i] = np.float32(0.0)
        if int8_a:
            _int8_blocks(xs[r], block)
    for chunk in range(panels):
        for r in range(m):
            xr = xs[r]
            acc[:] = 0.0
            for blk in range(k_blocks):
                d[:] = 0.0
                s = np.float32(0.0)
                for j in range(blk * per_blk, (blk + 1) * per_blk):
                    c0 = np.uint64((chunk * rows + j) * 64)
                    if nibbles:
                        xe = xr[2 * j]
                        xd = xr[2 * j + 1]
                        s += xe + xd
                        for i in range(64):
                            f = np.float32(codes[c0 + np.uint64(i)])
                            hi = np.floor(f * sixteenth)
                            d[i] += (f - hi * sixteen) * xe + hi * xd
                    else:
                        xv = xr[j]
                        s += xv
                        for i in range(64):
                            d[i] += np.float32(codes[c0 + np.uint64(i)]) * xv
                sb = np.uint64((chunk * k_blocks + blk) * 64)
                for i in range(64):
                    u = np.uint64(i)
                    acc[i] += scale[sb + u] * d[i] - scale_zp[sb + u] * s
            out = yo + r * n + chunk * 64
            for i in range(min(64, n - chunk * 64)):
                y[out + i] = acc[i]


@njit(nogil=True, cache=True)
def _int8_blocks(row, block):  # pragma: no cover - compiled
    # the row as its int8 blocks dequantize (``accuracy_level=4``, as
    # kernels/contrib/matmul_nbits_int8 quantizes): per block amax / 127 * rint(a * 127 /
    # amax); a non-finite block becomes NaN
    for k0 in range(0, row.size, block):
        amax = np.float32(0.0)
        for i in range(k0, k0 + block):
            v = abs(row[i])
            if not v <= amax:
                amax = v
        if not amax < np.float32(np.inf):
            row[k0 : k0 + block] = np.float32(np.nan)
            continue
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        sc = amax / np.float32(127.0)
        for i in range(k0, k0 + block):
            row[i] = np.rint(row[i] * inv) * sc


stamp_with_siblings(globals())
