"""The weight-only 4-bit product at ``accuracy_level=4`` in generated native code: A's rows
quantized to int8 per block and multiplied by the codes in integers, by the interpreter's
LLVM IR kernels (``kernels/lib/qnbits_ir``: its quantizer, then its product over every
panel, on the calling thread).

``nbits_rows_i4(x, xo, m, k, words, scale, zps, y, yo, n, block, xs, qa, ablk, out)``: for
each of ``m`` rows of ``x`` (``k`` floats from ``xo + r * k``), ``y[yo + r * n + c]`` = the
level-4 product (``kernels/contrib/matmul_nbits_int8``) with the weight as ``NBitsWeight``
lays it out for that kernel: ``words`` the bytes of ``icodes`` (panels, k_groups, 64, 4) and
``zps`` those of ``zp8`` (panels, k_blocks, 64), both as int32 words; ``scale`` (panels,
k_blocks, 64) float32; all flat. ``xs``, ``qa``, ``ablk``, ``out``: float32 scratch (the
caller's arena) of ``m * kp``, ``m * kp / 4`` (int8 codes, four to a slot), ``m * k_blocks
* 2`` and ``m * panels * 64`` elements, ``kp`` K rounded up to the block. Stateless; any
thread; the caller checks the bounds.

Importing this module builds (or loads) the kernels and registers their symbols, before
numba compiles or loads a function that calls them; where they are off (no llvmlite JIT,
``$TFRT_PY_ISA=portable``, the packed kernels switched off) it raises ImportError, and the
lowering, which asks first, emits ``nbits.nbits_rows_f4`` instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...kernels.lib import qnbits_ir
from .closure_cache import stamp_with_siblings

__all__ = ["nbits_rows_i4"]

_FNS = qnbits_ir.kernel()
if _FNS is None:
    raise ImportError(f"the int8 x 4-bit kernels are off here ({qnbits_ir.describe()})")
qnbits_gemv, qnbits_quant = _FNS


@njit(nogil=True, cache=True)
def nbits_rows_i4(x, xo, m, k, words, scale, zps, y, yo, n, block, xs, qa_slots, ablk,
                  out):  # pragma: no cover - compiled  # fmt: skip
    codes = words.view(np.uint8)
    zp = zps.view(np.uint8)
    qa = qa_slots.view(np.int8)
    panels = (n + 63) // 64
    kp = (k + block - 1) // block * block
    for r in range(m):  # the rows, zeros past k
        for i in range(k):
            xs[r * kp + i] = x[xo + r * k + i]
        for i in range(k, kp):
            xs[r * kp + i] = np.float32(0.0)
    qnbits_quant(xs.ctypes.data, m, kp, block, qa.ctypes.data, ablk.ctypes.data)
    cols = panels * 64
    qnbits_gemv(codes.ctypes.data, qa.ctypes.data, ablk.ctypes.data, scale.ctypes.data,
                zp.ctypes.data, out.ctypes.data, cols, m, kp // 8, block // 8, 0,
                panels)  # fmt: skip
    for r in range(m):
        for c in range(n):
            y[yo + r * n + c] = out[r * cols + c]


stamp_with_siblings(globals())
