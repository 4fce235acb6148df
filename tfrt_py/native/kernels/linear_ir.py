"""A LinearClassifier's (or liblinear SVM's) many rows in generated native code, their sums
by the LLVM IR kernel of ``kernels/lib/linear_rows_ir`` (vectors of rows, sums in
registers), each row then finished as ``svm.linear_cls_rows`` finishes it.

``linear_cls_rows_ir`` takes ``svm.linear_cls_rows``'s arguments and gives its results
bit for bit (the kernel's sums are the fused chain the generated module's one-row body
computes); ``s`` is float32 scratch of ``ROWS * n`` (the caller's arena; ``ROWS`` is
``linear_rows_ir.ROWS``). Rows ``ROWS`` at a time: the kernel's sums for them, then their
labels and scores. Stateless; any thread; the caller checks the bounds.

Importing this module builds (or loads) the kernel and registers its symbol, before numba
compiles or loads a function that calls it; where it is off (no llvmlite JIT, no AVX2,
``$TFRT_PY_ISA=portable``, the packed kernels switched off) it raises ImportError, and the
lowering, which asks first, emits ``svm.linear_cls_rows`` instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...kernels.lib import linear_rows_ir
from .svm import _linear_cls_finish

__all__ = ["linear_cls_rows_ir"]

ROWS = linear_rows_ir.ROWS
_FN = linear_rows_ir.kernel()
if _FN is None:
    raise ImportError(f"the linear rows kernel is off here ({linear_rows_ir.describe()})")
_rows_sums = _FN


@njit(nogil=True, cache=False, inline="always")
def linear_cls_rows_ir(x, xo, rows, f, w, b, n, labels, binary, two, pos, neg, lin_argmax,
                       all_positive, code, s, lab, lo, y, yo):  # pragma: no cover  # fmt: skip
    width = (2 if two else 1) if binary else n
    px, pw, ps = x.ctypes.data, w.ctypes.data, s.ctypes.data
    for r0 in range(0, rows, ROWS):
        m = min(ROWS, rows - r0)
        _rows_sums(px + np.uint64((xo + r0 * f) * 4), m, f, pw, n, ps)
        for q in range(m):
            r = r0 + q
            _linear_cls_finish(s, q * n, b, n, labels, binary, two, pos, neg, lin_argmax,
                               all_positive, code, lab, lo + r, y, yo + r * width)  # fmt: skip
