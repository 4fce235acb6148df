"""Lowering for com.microsoft MatMulNBits, the weight-only 4/8-bit product of
``onnxruntime.quantization``'s ``MatMulNBitsQuantizer`` (issue 36): with it a 4-bit
decoder's whole decode step lowers, as its float32 source does.

The constant weight is laid out at lowering as the interpreter lays it out
(``kernels/contrib/matmul_nbits.NBitsWeight``: panels of 64 columns, 4-bit codes two to a
byte) and stays quantized among the constants (the bytes as int32 words); the code is one
``nbits_rows_f4`` call (``native/kernels/nbits.py``), the interpreter's GEMV loop. At
``accuracy_level=4`` (4-bit codes, zero points absent or packed) the weight is laid out for
the integer kernels instead and the code is one ``nbits_rows_i4`` call
(``native/kernels/nbits_int8.py``: A's int8 blocks times the codes, the interpreter's
LLVM IR kernels); where those are off, and for 8-bit codes, ``nbits_rows_f4`` multiplies
the rows as their int8 blocks dequantize (level 4's values, the float loop's speed).
Declined: a weight, scales or zero points given at run time, ``g_idx``, a bias, more
than ``GEMV_ROWS`` rows (a prompt: the interpreter's dequantize-and-gemm serves it) but on
the integer kernels (up to ``MAX_INT8_ROWS``: they take a prompt's rows 4 at a time),
another dtype than float32. Same contract as ``ops.py``: ``fn(cx, node) -> lines``; pure;
load time or the compile worker.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import Node
from ...kernels.contrib.matmul_nbits import GEMV_ROWS, NBitsWeight
from ...kernels.lib import qnbits_ir
from .records import Registry
from .source import literal

__all__ = ["NBITS_IMPORT", "NBITS_INT8_IMPORT", "register_lowerings"]

_MS = "com.microsoft"
#: The import line of a module whose code calls ``nbits_rows_f4``.
NBITS_IMPORT = "from tfrt_py.native.kernels.nbits import nbits_rows_f4"
NBITS_INT8_IMPORT = "from tfrt_py.native.kernels.nbits_int8 import nbits_rows_i4"
#: rows a level-4 product takes on the integer kernels (a prompt's; its A scratch is ~5
#: bytes a row and k, allocated per call)
MAX_INT8_ROWS = 4096


class _Refusal:
    """What ``NBitsWeight`` raises through: its message as a ValueError (the interpreter's
    kernel refused such constants already, at load; here they only decline)."""

    @staticmethod
    def unsupported(message: str) -> ValueError:
        return ValueError(message)


def _matmul_nbits(cx: Any, node: Node) -> list[str]:
    at = node.attrs
    k, n = int(at.get("K", 0)), int(at.get("N", 0))
    bits, block = int(at.get("bits", 4)), int(at.get("block_size", 0))
    extra = [v for v in node.inputs[4:] if v is not None]
    if extra:
        cx.decline("MatMulNBits with g_idx or a bias")
    given = [*node.inputs[1:4], None, None, None][:3]
    consts = [cx.const(v) if v is not None else None for v in given]
    if consts[0] is None or consts[1] is None or (given[2] is not None and consts[2] is None):
        cx.decline("MatMulNBits with a weight given at run time")
    if block <= 0 or k <= 0 or n <= 0:
        cx.decline("MatMulNBits attributes")
    zp = None if consts[2] is None else np.asarray(consts[2])
    int8_a = at.get("accuracy_level") == 4 and (zp is None or zp.dtype == np.uint8)
    on_integers = int8_a and qnbits_ir.kernel() is not None  # nbits_int8 imports then
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    if str(x.dtype) != "float32" or str(y.dtype) != "float32" or x.shape[-1:] != (k,):
        cx.decline("MatMulNBits of another dtype or shape")
    m = x.size // k
    if m > GEMV_ROWS and not (on_integers and bits == 4):
        cx.decline(f"MatMulNBits over {m} rows (a prompt: the interpreter's gemm)")
    if m > MAX_INT8_ROWS:
        cx.decline(f"MatMulNBits over {m} rows (more than {MAX_INT8_ROWS} in one call)")
    try:
        w = NBitsWeight(_Refusal(), np.asarray(consts[0]), np.asarray(consts[1]),  # type: ignore[arg-type]
                        zp, k, n, bits, block, int8_a, on_integers)  # fmt: skip
    except ValueError as e:
        cx.decline(f"MatMulNBits constants: {e}")
    head = [x.buf, x.off, literal(m), literal(k)]
    tail = [y.buf, y.off, literal(n)]
    if w.icodes is not None:  # level 4 on the integer kernels; bytes as int32 words
        assert w.zp8 is not None
        as_words = (w.icodes.reshape(-1).view(np.int32), w.scale, w.zp8.reshape(-1).view(np.int32))
        words, scale, zps = (cx.const_slice(a) for a in as_words)
        cx.imports.add(NBITS_INT8_IMPORT)
        kp, f4 = w.k_blocks * block, np.dtype(np.float32)
        # the call's scratch in the arena (no allocation per step): the padded rows, their
        # int8 codes (four to a float32 slot), the blocks' scales, the panels' outputs
        scratch = [cx.view(cx.new_buffer((size,), f4)) for size in
                   (m * kp, -(-m * kp // 4), m * w.k_blocks * 2, m * w.panels * 64)]  # fmt: skip
        args = [*head, words, scale, zps, *tail, literal(block), *scratch]
        return [f"nbits_rows_i4({', '.join(args)})"]
    assert w.codes is not None and w.scale_zp is not None  # the float layout
    # the codes as int32 words (the constants' types have no bytes): the kernel views them
    codes, scale, scale_zp = (cx.const_slice(a) for a in (w.codes.reshape(-1).view(np.int32),
                                                          w.scale, w.scale_zp))  # fmt: skip
    cx.imports.add(NBITS_IMPORT)
    scratch = cx.view(cx.new_buffer((128 + m * w.k_blocks * block,), np.dtype(np.float32)))
    args = [*head, codes, scale, scale_zp, *tail, str(w.nibbles), literal(block), str(int8_a),
            scratch]  # fmt: skip
    return [f"nbits_rows_f4({', '.join(args)})"]


def register_lowerings(reg: Registry) -> None:
    """MatMulNBits (no row rule: rows mode declines it)."""
    reg.add(_MS, "MatMulNBits", _matmul_nbits)
