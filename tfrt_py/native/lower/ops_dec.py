"""Lowerings for the fused ops a KV-cache decoder's step is made of (issues 32 and 37):
``MatMulTransB`` (the scores ``Q @ K^T``, ``compiler/fuse_transformer.py``) and
``RotaryHalf`` (the rotate-half rotary embedding, ``compiler/fuse_rotary.py``), and the
attention output's product with the values of the past (``rows_times_cache``, called by
``ops_tx``'s batched MatMul). With grouped KV heads (a cache in place read by ``rep``
query heads a matrix) a group's query rows take one kernel call for the scores
(``kernels/lib/dotrows_ir``) and one for the values (``grouped_rows_times_cache``), which
read each row of the cache once for the group. With them optimum's GPT-2 and Llama
exports lower whole, and a box of past lengths (``generic.py``) serves every step of a
generation with one function.

Same contract as ``ops.py``: ``fn(cx, node) -> lines``; a case not handled calls
``cx.decline``. Pure functions of the node; run at load or on the compile worker.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...ir import Node, Value
from .cache import matrix_at
from .emit import tname
from .loops import Ref, bcast_strides, index, lane_reduce, loop_nest, strides
from .records import Registry
from .source import literal

__all__ = ["grouped_rows_times_cache", "register_lowerings", "rows_times_cache"]

_FUSED = "tfrt_py.fused"
#: The import line of a module whose code calls ``dot_rows_f4``.
ROWDOT_IMPORT = "from tfrt_py.native.kernels.rowdot import dot_rows_f4"
#: Float32 scores with at most this many query rows a matrix (a decode step's one) take a
#: dot product per key row (``dot_rows_f4``): BLAS packs the keys first, 4-5x the time at
#: one row (2-core Zen 3: 10 against 53 µs for 4 heads of 513 x 64); they break even near 6.
ROWDOT_MAX_ROWS = 4


def _scalar(cx: Any, v: Value | None) -> float:
    """A one-element scale input's value (1.0 when omitted); a scale known only at run
    time declines."""
    if v is None:
        return 1.0
    c = cx.const(v)
    if c is None or np.asarray(c).size != 1:
        cx.decline("a scale given at run time")
    return float(np.asarray(c).reshape(-1)[0])


def _matmul_transb(cx: Any, node: Node) -> list[str]:
    """``y = sa sb a @ swapaxes(b, -1, -2)`` over a stack of matrices (a and b of the
    output's batch): per matrix, at most ``ROWDOT_MAX_ROWS`` rows of float32 ``a`` as one
    ``dot_rows_f4`` call a row; else BLAS's gemm with b transposed where this body calls
    BLAS and the product is big enough (``NodeContext.blas_for``); else a dot product per
    element over b's contiguous rows."""
    a, b, y = cx.ref(node.inputs[0]), cx.stack_ref(node.inputs[1]), cx.out(node.outputs[0])
    if str(y.dtype) not in ("float32", "float64") or a.dtype != b.dtype or a.dtype != y.dtype:
        cx.decline(f"MatMulTransB of {a.dtype} x {b.dtype}")
    if len(a.shape) < 2 or len(b.shape) < 2:
        cx.decline("MatMulTransB of a vector")
    m, k = a.shape[-2:]
    n, k2 = b.shape[-2:]
    batch = y.shape[:-2]
    if k != k2 or y.shape[-2:] != (m, n) or a.shape[:-2] != batch or b.shape[:-2] != batch:
        cx.decline(f"MatMulTransB of shapes {a.shape} x {b.shape} -> {y.shape}")
    alpha = 1.0
    for v in node.inputs[2:]:
        alpha *= _scalar(cx, v)
    g, t = cx.tag, tname(y.dtype)
    M, K, N = literal(m), literal(k), literal(n)
    bq = f"{g}bq"
    grouped = _grouped_scores(cx, (a, b, y), (m, k, n), math.prod(batch), alpha)
    if grouped is not None:
        return grouped
    ao = f"{a.off} + {bq} * {literal(m * k)}"
    bo = matrix_at(b, bq, n * k)  # b: maybe a KV cache in place
    yo = f"{y.off} + {bq} * {literal(m * n)}"
    if t == "f4" and cx.choose(m <= ROWDOT_MAX_ROWS):
        cx.imports.add(ROWDOT_IMPORT)
        body = [f"for {g}m in range({M}):",
                f"    dot_rows_f4({a.buf}, {ao} + {g}m * {K}, {b.buf}, {bo}, {y.buf}, "
                f"{yo} + {g}m * {N}, {N}, {K}, {literal(alpha)})"]  # fmt: skip
    elif t == "f4" and cx.blas_for(m * k * n):
        body = [f"gemm_f4_ld({a.buf}, {ao}, {K}, {b.buf}, {bo}, {K}, True, {y.buf}, {yo}, "
                f"{N}, {M}, {K}, {N}, {literal(alpha)})"]  # fmt: skip
    else:
        s = f"{g}s"

        def dot(j: str) -> str:
            return f"{a.buf}[{ao} + {g}m * {K} + {j}] * {b.buf}[{bo} + {g}n * {K} + {j}]"

        store = f"{y.buf}[{yo} + {g}m * {N} + {g}n] = {s} * {t}({literal(alpha)})"
        body = [f"for {g}m in range({M}):", f"    for {g}n in range({N}):",
                *["        " + ln for ln in lane_reduce(s, k, dot, "sum", t)],
                f"        {store}"]  # fmt: skip
    return [f"for {bq} in range({literal(math.prod(batch))}):", *["    " + ln for ln in body]]


def _group(b: Ref, total: int) -> int:
    """The query heads that read each matrix of ``b`` (a stack of ``total`` matrices): its
    ``Ref.rep`` where ``b`` is a cache in place read by groups of heads that divide the
    stack, else 1 (each matrix its own)."""
    rep = b.rep if b.mat else 1
    return rep if rep > 1 and total % rep == 0 else 1


#: The import line of a module whose code calls ``dotrows_f4`` on rows of a vector count
#: (``dotrows_ir.wrapper_name``; importing it builds that count's function).
DOTROWS_IMPORT = "from tfrt_py.kernels.lib.dotrows_ir import {name}"


def _grouped_scores(cx: Any, aby: tuple[Ref, Ref, Ref], mkn: tuple[int, int, int], total: int,
                    alpha: float) -> list[str] | None:  # fmt: skip
    """Grouped KV heads (the keys a cache in place whose every matrix ``rep`` query heads
    read, ``Ref.rep``): a group's query rows (``rep`` matrices of at most
    ``ROWDOT_MAX_ROWS``) as one ``dotrows_f4`` call (``kernels/lib/dotrows_ir``), which
    reads each key row once for all of them; None where the keys are not such a cache,
    the rows are float64 or too long for the kernel, or it does not run here."""
    a, b, y = aby
    m, k, n = mkn
    rep = _group(b, total)
    if rep <= 1 or str(y.dtype) != "float32":
        return None
    from ...kernels.lib import dotrows_ir

    if not dotrows_ir.ready(k):
        return None
    if not cx.choose(m <= ROWDOT_MAX_ROWS):  # (a box's samples: its top's choice)
        return None
    name = dotrows_ir.wrapper_name(k)
    cx.imports.add(DOTROWS_IMPORT.format(name=name))
    bq = f"{cx.tag}bq"
    return [f"for {bq} in range({literal(total // rep)}):",
            f"    {name}({a.buf}, {a.off} + {bq} * {literal(rep * m * k)}, {b.buf}, "
            f"{b.off} + {bq} * {b.mat}, {y.buf}, {y.off} + {bq} * {literal(rep * m * n)}, "
            f"{literal(rep * m)}, {literal(k)}, {literal(n)}, {literal(alpha)})"]  # fmt: skip


def _point(cx: Any, v: Value | None, d: int) -> int:
    """RotaryHalf's split point: ONNX Slice's index rules for a constant ``h``."""
    c = cx.const(v) if v is not None else None
    if c is None or np.asarray(c).size != 1:
        cx.decline("a rotary split given at run time")
    h = int(np.asarray(c).reshape(-1)[0])
    if h < 0:
        h += d
    return min(max(h, 0), d)


def _rotary_half(cx: Any, node: Node) -> list[str]:
    """``y = x * cos + Concat(-x[..., h:], x[..., :h]) * sin``, cos and sin broadcast to x
    on every axis but the last, which they share with it."""
    x, cos, sin = (cx.ref(v) for v in node.inputs[:3])
    y = cx.out(node.outputs[0])
    if str(y.dtype) not in ("float32", "float64") or not (x.dtype == cos.dtype == sin.dtype):
        cx.decline(f"RotaryHalf of {x.dtype}")
    if not x.shape or y.shape != x.shape:
        cx.decline(f"RotaryHalf of shape {x.shape}")
    d = x.shape[-1]
    for r in (cos, sin):
        if not r.shape or r.shape[-1] != d:
            cx.decline(f"RotaryHalf's tables of shape {r.shape} for {x.shape}")
    k = _point(cx, node.inputs[3] if len(node.inputs) > 3 else None, d)
    rows = x.shape[:-1]
    try:
        cst = [s * d for s in bcast_strides(cos.shape[:-1], rows)]
        sst = [s * d for s in bcast_strides(sin.shape[:-1], rows)]
    except ValueError:
        cx.decline(f"RotaryHalf's tables of shape {cos.shape} for {x.shape}")
    xst = [s * d for s in strides(rows)]
    g = cx.tag

    def body(iv: list[str]) -> list[str]:
        xo = index(x.off, iv, xst)
        yo = index(y.off, iv, xst)
        co, so = index(cos.off, iv, cst), index(sin.off, iv, sst)

        def at(r: Ref, o: str, j: str) -> str:
            return f"{r.buf}[{o} + {j}]"

        m, K = literal(d - k), literal(k)
        return [
            f"for {g}j in range({m}):",
            f"    {at(y, yo, g + 'j')} = {at(x, xo, g + 'j')} * {at(cos, co, g + 'j')} - "
            f"{at(x, xo, f'{K} + {g}j')} * {at(sin, so, g + 'j')}",
            f"for {g}j in range({K}):",
            f"    {at(y, yo, f'{m} + {g}j')} = {at(x, xo, f'{m} + {g}j')} * "
            f"{at(cos, co, f'{m} + {g}j')} + {at(x, xo, g + 'j')} * {at(sin, so, f'{m} + {g}j')}",
        ]

    return loop_nest(rows, body, f"{g}i")


#: The import line of a module whose code calls ``rowvec_f4`` (importing it builds it).
ROWVEC_IMPORT = "from tfrt_py.kernels.lib.rowvec_ir import rowvec_f4"
#: Rows of ``a`` a matrix may have to take ``rowvec_f4`` (a decode step's query rows; a
#: prompt's many rows go to BLAS or the loops)
ROWVEC_MAX_ROWS = 4
#: Rows of ``b`` (the past) from which it does (at fewer the loops are as fast)
ROWVEC_MIN_ROWS = 64


def rows_times_cache(cx: Any, a: Ref, b: Ref, y: Ref, mkn: tuple[int, int, int],
                     group: int = 1) -> list[str] | None:  # fmt: skip
    """A decode step's attention output, ``y = a @ b`` for a few float32 rows of ``a`` (its
    probabilities; ``group`` matrices of ``mkn``'s ``m`` rows each, one after another, that
    share ``b``: grouped KV heads) and a ``b`` of ``ROWVEC_MIN_ROWS`` rows or more (the
    values of a past; a box decides at its top), as one ``rowvec_f4`` call over the
    ``group * m`` rows (``kernels/lib/rowvec_ir``: the rows of sums in registers, each row
    of ``b`` read once for several rows of ``a``); None where that does not apply or the
    kernel does not run here."""
    m, k, n = mkn
    if str(y.dtype) != "float32" or a.dtype != y.dtype:
        return None
    from ...kernels.lib import rowvec_ir

    if n < rowvec_ir.lanes() or rowvec_ir.kernel() is None:
        return None
    # a box's samples all take its top's choice (the same code for every sample)
    if not cx.choose(m <= ROWVEC_MAX_ROWS and k >= ROWVEC_MIN_ROWS):
        return None
    cx.imports.add(ROWVEC_IMPORT)
    return [f"rowvec_f4({a.buf}, {a.off}, {b.buf}, {b.off}, {y.buf}, {y.off}, "
            f"{literal(group * m)}, {literal(k)}, {literal(n)})"]  # fmt: skip


def grouped_rows_times_cache(cx: Any, a: Ref, b: Ref, y: Ref, mkn: tuple[int, int, int],
                             total: int, bq: str) -> list[str] | None:  # fmt: skip
    """Grouped KV heads (a cache in place whose every matrix ``rep`` query heads read,
    ``Ref.rep``): the rows of a group's ``rep`` matrices as one ``rows_times_cache`` call
    against their one matrix of values, which it then reads once for all of them; None
    where the stack is not such a cache or that does not apply."""
    rep = _group(b, total)
    if rep <= 1:
        return None
    m, k, n = mkn
    sub_a = Ref(a.buf, f"{a.off} + {bq} * {literal(rep * m * k)}", (rep * m, k), a.dtype, a.root)
    sub_b = Ref(b.buf, f"{b.off} + {bq} * {b.mat}", (k, n), b.dtype, b.root)
    sub_y = Ref(y.buf, f"{y.off} + {bq} * {literal(rep * m * n)}", (rep * m, n), y.dtype, y.root)
    inner = rows_times_cache(cx, sub_a, sub_b, sub_y, mkn, rep)
    if inner is None:
        return None
    return [f"for {bq} in range({literal(total // rep)}):"] + ["    " + ln for ln in inner]


def register_lowerings(reg: Registry) -> None:
    """The decoder ops lowered here (no row rule: rows mode declines them)."""
    reg.add(_FUSED, "MatMulTransB", _matmul_transb)
    reg.add(_FUSED, "RotaryHalf", _rotary_half)
