"""Products by a 2-D weight: MatMul, Gemm and FusedMatMul (``weights_product``) and
Attention's projection (``packed_product``).

In signature bodies and rows mode's bodies (``cx.packed_products``) a constant float32 weight
goes to the packed-panel kernel (``kernels/lib/gemm_packed``): packed into its panels here,
at lowering, and stored in place of the matrix; at a width that is not a multiple of the
panel width, a product over at most ``emit.CHAIN_K`` terms is padded with zero columns (at
most doubling its work), so each output is onnxruntime's chain of fused multiply-adds.
Where that does not apply (another dtype, a wider K or a narrower N at such a width, a
static body, a host without the kernel) the product is ``emit.matmul``'s (NumPy's gemm or
loops). Runs at load on the loading thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import compiled_gate
from ...ir import Value
from .emit import CHAIN_K, chains, matmul
from .loops import Ref
from .source import literal

__all__ = ["CHAIN_K", "PACKED_IMPORT", "packed_product", "weights_product"]

PACKED_IMPORT = "from tfrt_py.kernels.lib.gemm_packed import sgemm_packed"


def _panel_width() -> int:
    """This process's packed panel width; 0 without the kernel (no JIT for it here, or
    the portable path), and 0 (not remembered) while a cold process holds the compiled
    kernels back on this thread (``concurrency.compiled_gate``)."""
    if _WIDTH:
        return _WIDTH[0]
    from ...kernels.lib import gemm_packed

    if compiled_gate.held():
        return 0
    shape = gemm_packed.tile() if gemm_packed.kernel() is not None else None
    _WIDTH[:] = [0 if shape is None else shape.nr]
    return _WIDTH[0]


_WIDTH: list[int] = []  # [the width] once decided


def packed_product(cx: Any, x: Ref, w: np.ndarray | None, y: Ref, mkn: tuple[int, int, int],
                   ldx: int, bias: Ref | None = None,
                   relu: bool = False) -> list[str] | None:  # fmt: skip
    """``y[m, :] = x[m, :] @ w [+ bias] [ReLU]`` (x rows ``ldx`` elements apart, y
    contiguous (M, N), ``bias`` N floats) as one ``sgemm_packed`` call over ``w`` packed, the
    epilogue applied as the kernel stores; at a width N that is not a multiple of the panel
    width, without an epilogue and for K <= ``CHAIN_K``, padded (``_padded_product``); None
    where that does not apply."""
    m, k, n = mkn
    if not cx.packed_products or w is None or w.ndim != 2 or w.shape != (k, n):
        return None
    if str(w.dtype) != "float32" or x.dtype != w.dtype or y.dtype != w.dtype:
        return None
    if bias is not None and (bias.size != n or bias.dtype != w.dtype):
        return None
    nr = _panel_width()
    if not nr:
        return None
    if n % nr:
        if k > CHAIN_K or bias is not None or relu:
            return None  # (the caller applies a bias and a ReLU after the product)
        return _padded_product(cx, x, w, y, mkn, ldx, nr)
    from ...kernels.lib.gemm_packed import pack

    panels = cx.put_const(pack(w))
    cx.imports.add(PACKED_IMPORT)
    b = bias if bias is not None else panels  # read without flag 1, never used
    flags = (1 if bias is not None else 0) | (2 if relu else 0)
    return [_kernel_call(x, ldx, panels, y, (m, k, n), b, flags, nr)]


def _kernel_call(x: Ref, ldx: int, panels: Ref, y: Ref, mkn: tuple[int, int, int], b: Ref,
                 flags: int, nr: int) -> str:  # fmt: skip
    """The ``sgemm_packed`` call: ``y``'s rows ``n`` floats apart (contiguous (M, N))."""
    m, k, n = mkn
    N = literal(n)
    return (f"sgemm_packed({x.buf}, {x.off}, {literal(ldx)}, {panels.buf}, {panels.off}, "
            f"{y.buf}, {y.off}, {N}, {literal(m)}, {literal(k)}, {N}, {b.buf}, {b.off}, "
            f"{literal(flags)}, {literal(nr)})")  # fmt: skip


def _padded_product(cx: Any, x: Ref, w: np.ndarray, y: Ref, mkn: tuple[int, int, int],
                    ldx: int, nr: int) -> list[str] | None:  # fmt: skip
    """``packed_product`` without an epilogue for a width ``n`` that is not a multiple of
    ``nr``: the weights packed with zero columns up to the next multiple, the kernel's rows
    stored into an arena scratch of that width, and their first ``n`` columns copied out.
    None where the padding would more than double the work (NumPy's gemm stays)."""
    from ...kernels.lib.gemm_packed import pack

    m, k, n = mkn
    wide = -(-n // nr) * nr
    if wide > 2 * n:
        return None
    padded = np.zeros((k, wide), np.float32)
    padded[:, :n] = w
    panels = cx.put_const(pack(padded))
    rows = cx.new_buffer((m * wide,), np.dtype(np.float32))
    cx.imports.add(PACKED_IMPORT)
    N, W, M, g = literal(n), literal(wide), literal(m), cx.tag
    return [_kernel_call(x, ldx, panels, rows, (m, k, wide), panels, 0, nr),
            f"for {g}r in range({M}):",
            f"    for {g}j in range({N}):",
            f"        {y.buf}[{y.off} + {g}r * {N} + {g}j] = "
            f"{rows.buf}[{rows.off} + {g}r * {W} + {g}j]"]  # fmt: skip


def weights_product(cx: Any, a: Ref, bv: Value | None, y: Ref, trans_a: bool,
                    trans_b: bool) -> list[str]:  # fmt: skip
    """``y = op(a) @ op(b)`` for a 2-D ``b`` (a constant one transposed at lowering when
    ``trans_b``); ``a`` 2-D when ``trans_a``, else any rank (its rows flattened)."""
    if bv is None:
        cx.decline("MatMul without its second operand")
    w = cx.const(bv)
    if w is not None and w.ndim == 2:
        w = np.ascontiguousarray(w.T) if trans_b else w
        trans_b = False  # a constant is transposed here
    else:
        w = None
    shape = w.shape if w is not None else cx.ref(bv).shape
    if len(a.shape) < 2 or len(shape) != 2:
        cx.decline(f"MatMul of shapes {a.shape} x {shape} (2-D weights only)")
    if trans_a and len(a.shape) != 2:
        cx.decline("transA on a batch")
    k = a.shape[-2] if trans_a else a.shape[-1]
    n = shape[0] if trans_b else shape[1]
    m = a.size // k
    if not trans_a:
        lines = packed_product(cx, a, w, y, (m, k, n), k)
        if lines is not None:
            return lines
    b = cx.put_const(w) if w is not None else cx.ref(bv)
    if a.dtype != b.dtype:
        cx.decline(f"MatMul of {a.dtype} x {b.dtype}")
    x_st = (1, m) if trans_a else (k, 1)
    w_st = (1, k) if trans_b else (n, 1)
    return matmul(cx.tag, a, b, y, (m, k, n), x_st, w_st, blas=cx.blas_for(m * k * n),
                  chain=chains(w, k))  # fmt: skip
