"""The weight-only 4/8-bit product of generated native code (com.microsoft MatMulNBits at a
decode step's few rows, ``lower/ops_nbits.py``): the interpreter's GEMV loop
(``kernels/contrib/matmul_nbits._gemv``) over the same panels, on one thread, reading and
writing flat float32 buffers at element offsets.

``nbits_rows_f4(x, xo, m, k, codes, scale, scale_zp, y, yo, n, nibbles, block)``: for each
of ``m`` rows of ``x`` (``k`` floats from ``xo + r * k``), ``y[yo + r * n + c] = sum_k
x[k] * w[k, c]`` with ``w`` the dequantized weight held as ``NBitsWeight`` lays it out
(``words``: the bytes of ``codes`` (panels, rows, 64) uint8 as int32 words, 4-bit codes two
to a byte when ``nibbles``;
``scale`` and ``scale_zp`` (panels, k_blocks, 64) float32), flat; the codes past ``k`` in
the last block meet zeros. Per panel of 64 columns and block, ``d[c] = sum code * x``
unpacked in registers, then ``acc += scale * d - scale_zp * sum x``: the interpreter's sums
in its order. Stateless; any thread; the caller checks the bounds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["nbits_rows_f4"]


@njit(nogil=True, cache=True, fastmath={"contract"})
def nbits_rows_f4(
    x, xo, m, k, words, scale, scale_zp, y, yo, n, nibbles, block
):  # pragma: no cover - compiled
    codes = words.view(np.uint8)
    panels = (n + 63) // 64
    k_blocks = (k + block - 1) // block
    rows = k_blocks * block // 2 if nibbles else k_blocks * block
    per_blk = rows // k_blocks
    sixteenth = np.float32(0.0625)
    sixteen = np.float32(16.0)
    d = np.empty(64, np.float32)
    acc = np.empty(64, np.float32)
    for chunk in range(panels):
        for r in range(m):
            xr = xo + r * k
            acc[:] = 0.0
            for blk in range(k_blocks):
                d[:] = 0.0
                s = np.float32(0.0)
                for j in range(blk * per_blk, (blk + 1) * per_blk):
                    c0 = np.uint64((chunk * rows + j) * 64)
                    if nibbles:
                        xe = x[xr + 2 * j] if 2 * j < k else np.float32(0.0)
                        xd = x[xr + 2 * j + 1] if 2 * j + 1 < k else np.float32(0.0)
                        s += xe + xd
                        for i in range(64):
                            f = np.float32(codes[c0 + np.uint64(i)])
                            hi = np.floor(f * sixteenth)
                            d[i] += (f - hi * sixteen) * xe + hi * xd
                    else:
                        xv = x[xr + j] if j < k else np.float32(0.0)
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
