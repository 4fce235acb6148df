"""Lowerings for the ops small transformers add to the native table (issue 14): logic and
comparisons on any dtype (the masks), Expand, batched MatMul, and LayerNormalization /
RMSNormalization over the last axes.

Same contract as ``ops.py``: ``fn(cx, node) -> lines``; a case not handled calls
``cx.decline``. Numbers reach the text through ``source.literal`` only. Pure functions of
the node; run at load on the loading thread.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...ir import Node, Value
from .cache import matrix_at
from .context import CACHE_DECLINE
from .emit import EXP_IMPORT, Step, copy_strided, elementwise, matmul, tname
from .loops import (
    LANES,
    Ref,
    bcast_strides,
    coalesce,
    index,
    lane_reduce,
    loop_nest,
    pairwise,
    strides,
)
from .ops_dec import grouped_rows_times_cache, rows_times_cache
from .products import packed_product, weights_product
from .records import Registry
from .source import literal

__all__ = ["attention_core", "batched_matmul", "embed_norm", "register_lowerings"]

_FLOATS = ("float32", "float64")

#: op -> the scalar expression of its loaded operands ``a`` (bool results are np.bool_).
_LOGIC: dict[str, Any] = {
    "And": lambda a: f"({a[0]} and {a[1]})",
    "Or": lambda a: f"({a[0]} or {a[1]})",
    "Xor": lambda a: f"({a[0]} != {a[1]})",
    "Not": lambda a: f"(not {a[0]})",
    "IsNaN": lambda a: f"({a[0]} != {a[0]})",
    "Equal": lambda a: f"({a[0]} == {a[1]})",
    "Less": lambda a: f"({a[0]} < {a[1]})",
    "Greater": lambda a: f"({a[0]} > {a[1]})",
    "LessOrEqual": lambda a: f"({a[0]} <= {a[1]})",
    "GreaterOrEqual": lambda a: f"({a[0]} >= {a[1]})",
    "Where": lambda a: f"({a[1]} if {a[0]} else {a[2]})",
}
_BOOL_IN = frozenset({"And", "Or", "Xor", "Not"})


def _logic(cx: Any, node: Node) -> list[str]:
    """A comparison, a logical op or Where, elementwise with NumPy broadcasting: one loop
    nest, each operand loaded once per element."""
    op = node.op_type
    y = cx.out(node.outputs[0])
    ins = [cx.ref(v) for v in node.inputs]
    n_in = 3 if op == "Where" else 1 if op in ("Not", "IsNaN") else 2
    if len(ins) != n_in:
        cx.decline(f"{op} with {len(ins)} inputs")
    if op in _BOOL_IN and any(str(r.dtype) != "bool" for r in ins):
        cx.decline(f"{op} of non-bool operands")
    if op == "Where" and str(ins[0].dtype) != "bool":
        cx.decline("Where with a non-bool condition")
    if op == "IsNaN" and str(ins[0].dtype) not in _FLOATS:
        cx.decline(f"IsNaN of {ins[0].dtype}")
    if op not in ("Where",) and n_in == 2 and ins[0].dtype != ins[1].dtype:
        cx.decline(f"{op} of mixed dtypes")
    if op == "Where" and not (ins[1].dtype == ins[2].dtype == y.dtype):
        cx.decline("Where of mixed dtypes")
    t = tname(y.dtype)
    lists = [strides(y.shape)] + [bcast_strides(r.shape, y.shape) for r in ins]
    shape, sts = coalesce(y.shape, lists)
    g = cx.tag

    def body(iv: list[str]) -> list[str]:
        lines = []
        names = []
        for k, r in enumerate(ins):
            names.append(f"{g}u{k}")
            lines.append(f"{g}u{k} = {r.buf}[{index(r.off, iv, sts[k + 1])}]")
        lines.append(f"{y.buf}[{index(y.off, iv, sts[0])}] = {t}({_LOGIC[op](names)})")
        return lines

    return loop_nest(shape, body)


def _expand(cx: Any, node: Node) -> list[str]:
    """Expand: the input read at the output's positions (its shape is the output's: known
    for the signature)."""
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    if x.dtype != y.dtype:
        cx.decline("Expand changing the dtype")
    sts = [strides(y.shape), bcast_strides(x.shape, y.shape)]
    shape, st = coalesce(y.shape, sts)

    def body(iv: list[str]) -> list[str]:
        return [f"{y.buf}[{index(y.off, iv, st[0])}] = {x.buf}[{index(x.off, iv, st[1])}]"]

    return loop_nest(shape, body)


def _tile(cx: Any, node: Node) -> list[str]:
    """Tile: ``y[i] = x[i mod x.shape]`` on every axis; the repeats are folded (the
    output's shape is known for the signature). Each axis is walked as (repeat, position)
    so the source index needs no modulo."""
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    if x.dtype != y.dtype or len(x.shape) != len(y.shape):
        cx.decline("Tile changing the dtype or rank")
    if y.size == 0:
        return []
    shape: list[int] = []
    ys: list[int] = []
    xs: list[int] = []
    for n, m, so, sx in zip(x.shape, y.shape, strides(y.shape), strides(x.shape)):
        if m % n:
            cx.decline("Tile whose output is not a multiple of its input")
        shape += [m // n, n]
        ys += [n * so, so]
        xs += [0, sx]
    dims, st = coalesce(shape, [ys, xs])

    def body(iv: list[str]) -> list[str]:
        return [f"{y.buf}[{index(y.off, iv, st[0])}] = {x.buf}[{index(x.off, iv, st[1])}]"]

    return loop_nest(dims, body)


def _batched_matmul(cx: Any, node: Node) -> list[str]:
    """MatMul of two operands of rank >= 3 whose batch dims agree or broadcast (attention's
    products): one ``emit.matmul`` per matrix of the output's batch, loops or BLAS."""
    a, b, y = cx.ref(node.inputs[0]), cx.stack_ref(node.inputs[1]), cx.out(node.outputs[0])
    if str(y.dtype) not in _FLOATS or a.dtype != b.dtype:
        cx.decline(f"MatMul of {a.dtype} x {b.dtype}")
    if len(a.shape) < 2 or len(b.shape) < 2:
        cx.decline("MatMul of a vector")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        cx.decline(f"MatMul of shapes {a.shape} x {b.shape}")
    batch = y.shape[:-2]
    a_mat, b_mat, y_mat = m * k, k * n, m * n
    g = cx.tag
    if a.shape[:-2] == b.shape[:-2] == batch:  # one loop over the stack
        bq = f"{g}bq"
        grouped = grouped_rows_times_cache(cx, a, b, y, (m, k, n), math.prod(batch), bq)
        if grouped is not None:
            return grouped
        sub_a = Ref(a.buf, f"{a.off} + {bq} * {literal(a_mat)}", (m, k), a.dtype, a.root)
        # b may be a KV cache in place (cache.py)
        sub_b = Ref(b.buf, matrix_at(b, bq, b_mat), (k, n), b.dtype, b.root)
        sub_y = Ref(y.buf, f"{y.off} + {bq} * {literal(y_mat)}", (m, n), y.dtype, y.root)
        inner = rows_times_cache(cx, sub_a, sub_b, sub_y, (m, k, n))
        if inner is None:
            inner = matmul(
                g, sub_a, sub_b, sub_y, (m, k, n), (k, 1), (n, 1), blas=cx.blas_for(m * k * n)
            )
        return [f"for {bq} in range({literal(math.prod(batch))}):"] + ["    " + ln for ln in inner]
    if b.mat:
        cx.decline(f"{CACHE_DECLINE} MatMul broadcasting a present over its batch")
    ast = bcast_strides(a.shape[:-2], batch)
    bst = bcast_strides(b.shape[:-2], batch)
    lines: list[str] = []
    for q in range(math.prod(batch)):  # broadcast batch dims: one product per matrix
        pos = _unravel(q, batch)
        ao = sum(p * s for p, s in zip(pos, ast)) * a_mat
        bo = sum(p * s for p, s in zip(pos, bst)) * b_mat
        sub_a = Ref(a.buf, f"{a.off} + {literal(ao)}", (m, k), a.dtype, a.root)
        sub_b = Ref(b.buf, f"{b.off} + {literal(bo)}", (k, n), b.dtype, b.root)
        sub_y = Ref(y.buf, f"{y.off} + {literal(q * y_mat)}", (m, n), y.dtype, y.root)
        lines += matmul(f"{g}q{q}_", sub_a, sub_b, sub_y, (m, k, n), (k, 1), (n, 1),
                        blas=cx.blas_for(m * k * n))  # fmt: skip
    return lines


def _unravel(q: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for d in reversed(shape):
        out.append(q % d)
        q //= d
    return out[::-1]


def _norm(cx: Any, node: Node) -> list[str]:
    """LayerNormalization (``(x - mean) / sqrt(var + eps) * scale + bias``),
    RMSNormalization and onnxruntime's SimplifiedLayerNormalization (``x / sqrt(mean(x^2) +
    eps) * scale``) over axes ``axis..``. The extra outputs (mean, inverse std) are
    declined."""
    rms = node.op_type != "LayerNormalization"
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    if not all(_unused(cx, v) for v in node.outputs[1:]):
        cx.decline(f"{node.op_type} with its statistics outputs read")
    rank = len(x.shape)
    axis = int(node.attrs.get("axis", -1))
    axis += rank if axis < 0 else 0
    bias_v = node.inputs[2] if len(node.inputs) > 2 and not rms else None
    bias = None if bias_v is None else cx.ref(bias_v)
    eps = float(node.attrs.get("epsilon", 1e-5))
    return _norm_rows(cx, x, y, cx.ref(node.inputs[1]), bias, axis, eps, rms)


def _unused(cx: Any, v: Any) -> bool:
    """An omitted output, or one nothing reads and the graph does not return."""
    return v is None or (cx.readers.get(id(v), 0) == 0 and id(v) not in cx.outputs)


def _norm_rows(cx: Any, x: Ref, y: Ref, scale: Ref, bias: Ref | None, axis: int, eps: float,
               rms: bool) -> list[str]:  # fmt: skip
    """The normalization of ``x``'s rows (axes ``axis..``) into ``y``: per row the
    statistics accumulated in float64, the normalization in the model's dtype."""
    if str(y.dtype) not in _FLOATS or x.dtype != y.dtype:
        cx.decline(f"normalization of {x.dtype}")
    n = math.prod(x.shape[axis:])
    rows = math.prod(x.shape[:axis])
    for r in (scale, bias):
        if r is not None and (r.size != n or r.dtype != y.dtype):
            cx.decline(f"normalization parameters of shape {r.shape}")
    t, g, N = tname(y.dtype), cx.tag, literal(n)

    def at(r: Ref, row: str, j: str) -> str:
        return f"{r.buf}[{index(r.off, [row, j], [n, 1])}]"

    # the sums in LANES independent chains (a float64 add waits for the one before it;
    # LLVM may not reorder them without fast-math), then added pairwise
    lanes = LANES if n % LANES == 0 else 1
    ln = range(lanes)

    def body(iv: list[str]) -> list[str]:
        o = iv[0]
        lines = [*(f"{g}s{k} = 0.0" for k in ln), *(f"{g}q{k} = 0.0" for k in ln),
                 f"for j in range(0, {N}, {lanes}):"]  # fmt: skip
        for k in ln:
            jk = f"j + {k}" if k else "j"
            lines += [f"    {g}v{k} = f8({at(x, o, jk)})", f"    {g}s{k} += {g}v{k}",
                      f"    {g}q{k} += {g}v{k} * {g}v{k}"]  # fmt: skip
        lines += [f"{g}s = {pairwise([f'{g}s{k}' for k in ln])}",
                  f"{g}q = {pairwise([f'{g}q{k}' for k in ln])}",
                  f"{g}mean = {g}s / {literal(float(n))}"]  # fmt: skip
        if rms:
            lines += [f"{g}mean = 0.0", f"{g}var = {g}q / {literal(float(n))}"]
        else:
            lines += [f"{g}var = {g}q / {literal(float(n))} - {g}mean * {g}mean",
                      f"if {g}var < 0.0:", f"    {g}var = 0.0"]  # fmt: skip
        lines += [f"{g}inv = 1.0 / np.sqrt({g}var + {literal(eps)})",
                  f"{g}mt = {t}({g}mean)", f"{g}it = {t}({g}inv)",
                  f"for j in range({N}):"]  # fmt: skip
        val = f"({at(x, o, 'j')} - {g}mt) * {g}it * {scale.buf}[{scale.off} + j]"
        if bias is not None:
            val += f" + {bias.buf}[{bias.off} + j]"
        lines.append(f"    {at(y, o, 'j')} = {val}")
        return lines

    return loop_nest([rows], body, "p")


def _skip_norm(cx: Any, node: Node) -> list[str]:
    """onnxruntime's SkipLayerNormalization / SkipSimplifiedLayerNormalization: ``s = input
    + skip (+ bias)`` (into the ``input_skip_bias_sum`` output when asked for), then the
    normalization over the last axis (``epsilon`` default 1e-12). The mean and inverse std
    outputs are declined."""
    simplified = node.op_type == "SkipSimplifiedLayerNormalization"
    ins = list(node.inputs)
    x, skip, gamma = cx.ref(ins[0]), cx.ref(ins[1]), cx.ref(ins[2])
    beta_v = None if simplified or len(ins) < 4 else ins[3]
    bias_v = ins[3 if simplified else 4] if len(ins) > (3 if simplified else 4) else None
    outs = list(node.outputs) + [None] * 4
    if not (_unused(cx, outs[1]) and _unused(cx, outs[2])):
        cx.decline(f"{node.op_type} with its statistics outputs read")
    if skip.shape != x.shape:
        cx.decline(f"{node.op_type} with a broadcast skip {skip.shape}")
    y = cx.out(outs[0])
    total = cx.out(outs[3]) if outs[3] is not None else cx.new_buffer(x.shape, x.dtype)
    operands = [x, skip] + ([cx.ref(bias_v)] if bias_v is not None else [])
    steps: list[Step] = [("Add", {}, (0, 1))]
    if bias_v is not None:
        steps.append(("Add", {}, (-1, 2)))
    lines = elementwise(cx.tag, total, operands, steps, None)
    beta = None if beta_v is None else cx.ref(beta_v)
    eps = float(node.attrs.get("epsilon", 1e-12))
    return lines + _norm_rows(cx, total, y, gamma, beta, len(x.shape) - 1, eps, simplified)


def _gelu_like(cx: Any, node: Node) -> list[str]:
    """onnxruntime's BiasGelu (``Gelu(A + B)``, erf form) and FastGelu (the tanh form of
    ``X [+ bias]``): one elementwise pass."""
    y = cx.out(node.outputs[0])
    ins = [cx.ref(v) for v in node.inputs if v is not None]
    if str(y.dtype) not in _FLOATS or any(r.dtype != y.dtype for r in ins):
        cx.decline(f"{node.op_type} of {[str(r.dtype) for r in ins]}")
    tanh = node.op_type == "FastGelu"
    gelu: Step = ("Gelu", {"approximate": "tanh" if tanh else "none"}, (-1,))
    if len(ins) == 1:
        return elementwise(cx.tag, y, ins, [gelu], 0)
    return elementwise(cx.tag, y, ins, [("Add", {}, (0, 1)), gelu], None)


def _fused_matmul(cx: Any, node: Node) -> list[str]:
    """onnxruntime's FusedMatMul without transposes: ``alpha * A @ B`` (the product, then
    the scaling in place)."""
    at = node.attrs
    if any(int(at.get(k, 0)) for k in ("transA", "transB", "transBatchA", "transBatchB")):
        cx.decline("FusedMatMul with a transposed operand")
    a = cx.ref(node.inputs[0])
    wc = cx.const(node.inputs[1])  # a constant weight is not stored before its product
    rank = wc.ndim if wc is not None else len(cx.ref(node.inputs[1]).shape)
    if len(a.shape) < 2 or rank < 2:
        cx.decline("FusedMatMul of a vector")
    if rank > 2:
        lines = _batched_matmul(cx, node)
    else:
        lines = weights_product(cx, a, node.inputs[1], cx.out(node.outputs[0]), False, False)
    alpha = float(at.get("alpha", 1.0))
    if alpha == 1.0:
        return lines
    y = cx.refs[id(node.outputs[0])]
    c = cx.put_const(np.asarray([alpha], y.dtype))
    return lines + elementwise(cx.tag, y, [y, c], [("Mul", {}, (-1, 1))], 0)


def _gather_nd(cx: Any, node: Node) -> list[str]:
    """GatherND with ``batch_dims`` 0: each row of the (..., k) indices picks a slab of
    ``data`` (its trailing dims) by its first k coordinates; negative indices wrap,
    indices out of range raise IndexError, as Gather's lowering."""
    if int(node.attrs.get("batch_dims", 0)) != 0:
        cx.decline("GatherND with batch_dims")
    data, idx, y = cx.ref(node.inputs[0]), cx.ref(node.inputs[1]), cx.out(node.outputs[0])
    if str(idx.dtype) not in ("int64", "int32") or not idx.shape:
        cx.decline(f"GatherND indices of {idx.dtype} {idx.shape}")
    k = idx.shape[-1]
    if k > len(data.shape):
        cx.decline("GatherND indices longer than the data's rank")
    rows = math.prod(idx.shape[:-1])
    slab = math.prod(data.shape[k:])
    st = strides(data.shape)
    g, S, K = cx.tag, literal(slab), literal(k)
    lines = [f"for q in range({literal(rows)}):", f"    {g}o = 0"]
    for d in range(k):
        D = literal(data.shape[d])
        lines += [f"    {g}t = {idx.buf}[{idx.off} + q * {K} + {literal(d)}]",
                  f"    if {g}t < 0:", f"        {g}t += {D}",
                  f"    if {g}t < 0 or {g}t >= {D}:",
                  "        raise IndexError('GatherND index out of range')",
                  f"    {g}o += {g}t * {literal(st[d])}"]  # fmt: skip
    src = f"{data.buf}[{data.off} + {g}o + c]"
    lines += [f"    for c in range({S}):", f"        {y.buf}[{y.off} + q * {S} + c] = {src}"]
    return lines


def _split(cx: Any, node: Node) -> list[str]:
    """Split along one axis: each output a strided copy of its slice of the input (the
    pieces' sizes are the outputs' shapes, known for the signature)."""
    x = cx.ref(node.inputs[0])
    rank = len(x.shape)
    axis = int(node.attrs.get("axis", 0))
    axis += rank if axis < 0 else 0
    st = strides(x.shape)
    lines: list[str] = []
    begin = 0
    for v in node.outputs:
        if v is None:
            cx.decline("Split with an omitted output")
        y = cx.out(v)
        if y.dtype != x.dtype or len(y.shape) != rank:
            cx.decline("Split output of another dtype or rank")
        sub = Ref(x.buf, f"{x.off} + {literal(begin * st[axis])}", y.shape, x.dtype, x.root)
        lines += copy_strided(y, sub, st)
        begin += y.shape[axis]
    if begin != x.shape[axis]:
        cx.decline("Split pieces that do not cover the axis")
    return lines


def _ids_check(t: str, dim: int) -> list[str]:
    """Bounds check of id ``t`` (a temporary) into a table of ``dim`` rows, as the
    interpreter's: no negative wrap, out of range raises."""
    return [
        f"if {t} < 0 or {t} >= {literal(dim)}:",
        "    raise IndexError('Gather index out of range')",
    ]


def embed_norm(cx: Any, node: Any) -> list[str]:
    """onnxruntime's EmbedLayerNormalization without position_ids: ``word[ids] +
    position[0..S-1] (+ segment[segment_ids])`` per token (into ``embedding_sum`` when
    asked for), the LayerNorm of each (``epsilon`` default 1e-12), and ``mask_index``
    (int32 (B,): the ones in each row of ``mask``; zeros without one). ``node``: anything
    with its ``inputs``, ``outputs`` and ``attrs`` (QEmbedLayerNormalization's lowering,
    ``ops_quant``, passes its tables dequantized)."""
    ins = list(node.inputs) + [None] * 9
    ids, seg_ids, word, pos, seg = (ins[i] for i in range(5))
    gamma, beta, mask, pos_ids = ins[5], ins[6], ins[7], ins[8]
    if pos_ids is not None or (seg_ids is None) != (seg is None):
        cx.decline("EmbedLayerNormalization with position_ids, or half a segment input")
    idr, wr, pr = cx.ref(ids), cx.ref(word), cx.ref(pos)
    sr = None if seg is None else cx.ref(seg)
    sir = None if seg_ids is None else cx.ref(seg_ids)
    if len(idr.shape) != 2 or str(idr.dtype) not in ("int32", "int64"):
        cx.decline(f"input_ids {idr.dtype} {idr.shape}")
    if sir is not None and (sir.shape != idr.shape or str(sir.dtype) not in ("int32", "int64")):
        cx.decline("segment_ids of another shape or dtype")
    b_, s_ = idr.shape
    h = wr.shape[1]
    if s_ > pr.shape[0] or any(len(r.shape) != 2 or r.shape[1] != h for r in (wr, pr, *(
            [sr] if sr is not None else []))):  # fmt: skip
        cx.decline("embedding tables of other widths, or more tokens than positions")
    outs = list(node.outputs) + [None] * 3
    y = cx.out(outs[0])
    total = cx.out(outs[2]) if outs[2] is not None else cx.new_buffer((b_, s_, h), y.dtype)
    if not all(r.dtype == y.dtype for r in (wr, pr, total, *([sr] if sr else []))):
        cx.decline("EmbedLayerNormalization of mixed dtypes")
    g, H = cx.tag, literal(h)
    row = f"{wr.buf}[{wr.off} + {g}w * {H} + c] + {pr.buf}[{pr.off} + {g}p * {H} + c]"
    lines = [f"for q in range({literal(b_ * s_)}):",
             f"    {g}w = {idr.buf}[{idr.off} + q]",
             *["    " + ln for ln in _ids_check(f"{g}w", wr.shape[0])],
             f"    {g}p = q % {literal(s_)}"]  # fmt: skip
    if sr is not None and sir is not None:
        lines += [f"    {g}g = {sir.buf}[{sir.off} + q]",
                  *["    " + ln for ln in _ids_check(f"{g}g", sr.shape[0])]]  # fmt: skip
        row = f"({row}) + {sr.buf}[{sr.off} + {g}g * {H} + c]"
    lines += [
        f"    for c in range({H}):",
        f"        {total.buf}[{total.off} + q * {H} + c] = {row}",
    ]
    eps = float(node.attrs.get("epsilon", 1e-12))
    lines += _norm_rows(cx, total, y, cx.ref(gamma), cx.ref(beta), 2, eps, False)
    if outs[1] is not None:
        mi = cx.out(outs[1])
        if str(mi.dtype) != "int32":
            cx.decline("mask_index of another dtype")
        lines += [f"for bb in range({literal(b_)}):", f"    {g}n = 0"]
        if mask is not None:
            mr = cx.ref(mask)
            if mr.shape != (b_, s_):
                cx.decline("a mask of another shape than input_ids")
            lines += [f"    for c in range({literal(s_)}):",
                      f"        if {mr.buf}[{mr.off} + bb * {literal(s_)} + c] == 1:",
                      f"            {g}n += 1"]  # fmt: skip
        lines.append(f"    {mi.buf}[{mi.off} + bb] = i4({g}n)")
    return lines


def _attention(cx: Any, node: Node) -> list[str]:
    """onnxruntime's Attention for the export's common form: one (B, S, Hin) input, a
    constant merged Q/K/V weight and bias, an optional (B,) mask_index of end positions
    (keys at or after masked with ``mask_filter_value``, default -10000), no past,
    present or attention_bias, equal Q/K/V sizes, ``unidirectional`` 0. The projection
    (gemm), then per batch row and head: the scores ``scale q k^T``, the mask, softmax
    (the exponentials as one flat ``expf`` loop), the product by V into the merged
    (B, S, N * H) output. With BLAS (signature bodies) both products are gemm calls on
    strided views of the projection and the output; without (static bodies) the keys are
    transposed and scaled into a scratch, the products run through ``emit.matmul``'s
    loops and each head's rows are copied out. The interpreter's formulation to rounding
    (its products are BLAS's too). Emitted rather than a call of
    ``kernels/lib/sdpa``'s core: that core needs BLAS (static bodies have none), is a
    parallel loop (the tier splits rows itself) and sizes its loops at run time (these
    have the literal S)."""
    x, y, heads, d, scale = _attention_operands(cx, node)
    b_, s_, _ = x.shape
    qkv = cx.new_buffer((b_ * s_, 3 * d), y.dtype)
    lines = _attention_projection(cx, node, x, qkv)
    return lines + attention_core(cx, node, qkv, y, _input(node, 3), (heads, d, scale))


def attention_core(cx: Any, node: Node, qkv: Ref, y: Ref, mask_v: Value | None,
                   sizes: tuple[int, int, float]) -> list[str]:  # fmt: skip
    """The lines of Attention after its projection: ``qkv`` (B * S, 3D) into ``y`` (B, S,
    D) with ``mask_v`` the (B,) end positions or None; ``sizes`` (heads, D, scale).
    QAttention's lowering (``ops_quant``) shares it."""
    heads, d, scale = sizes
    b_, s_ = y.shape[0], y.shape[1]
    mask = None
    if mask_v is not None:
        mask = cx.ref(mask_v)
        if mask.shape != (b_,) or str(mask.dtype) not in ("int32", "int64"):
            cx.decline(f"Attention mask_index {mask.shape} (the (B,) end positions only)")
    cx.imports.add(EXP_IMPORT)
    sc = cx.new_buffer((s_, s_), y.dtype)
    scores, product = _attention_products(cx, qkv, sc, y, (s_, d, d // heads), scale)
    fill = float(node.attrs.get("mask_filter_value", -10000.0))
    return _attention_heads(cx, sc, mask, (b_, s_, heads), fill, scores, product)


def _input(node: Node, i: int) -> Value | None:
    """``node``'s input ``i``, None when omitted or absent."""
    return node.inputs[i] if i < len(node.inputs) else None


def _attention_operands(cx: Any, node: Node) -> tuple[Ref, Ref, int, int, float]:
    """(input, output, heads, Q/K/V hidden size, scale) of a com.microsoft Attention
    ``_attention`` lowers; ``cx.decline`` for any other form."""
    at = node.attrs
    heads = int(at.get("num_heads", 0))
    ins = [_input(node, i) for i in range(7)]
    if any(ins[i] is not None for i in (4, 5, 6)) or any(v is not None for v in node.outputs[1:]):
        cx.decline("Attention with past, present or attention_bias")
    if int(at.get("unidirectional", 0)) or at.get("qkv_hidden_sizes") is not None:
        cx.decline("Attention unidirectional or with qkv_hidden_sizes")
    if int(at.get("do_rotary", 0)) or int(at.get("past_present_share_buffer", 0)):
        cx.decline("Attention decoder options")
    x, wc = cx.ref(ins[0]), cx.const(ins[1])
    w = cx.ref(ins[1]) if wc is None else wc  # a constant is stored by its product
    y = cx.out(node.outputs[0])
    if str(y.dtype) != "float32" or x.dtype != y.dtype or w.dtype != y.dtype:
        cx.decline("Attention of another dtype than float32")
    if len(x.shape) != 3 or len(w.shape) != 2 or w.shape[0] != x.shape[2] or w.shape[1] % 3:
        cx.decline(f"Attention of shapes {x.shape} x {w.shape}")
    d = w.shape[1] // 3
    if heads <= 0 or d % heads:
        cx.decline("Attention heads")
    return x, y, heads, d, float(at.get("scale", 0.0)) or 1.0 / math.sqrt(d // heads)


def _attention_projection(cx: Any, node: Node, x: Ref, qkv: Ref) -> list[str]:
    """``qkv = x @ W (+ bias)``: the packed product of a constant W, else ``emit.matmul``."""
    b_, s_, hin = x.shape
    d3 = qkv.shape[1]
    wc = cx.const(node.inputs[1])
    mkn = (b_ * s_, hin, d3)
    lines = packed_product(cx, x, wc, qkv, mkn, hin)
    if lines is None:
        w_ref = cx.ref(node.inputs[1])
        lines = matmul(
            cx.tag, x, w_ref, qkv, mkn, (hin, 1), (d3, 1), blas=cx.blas_for(math.prod(mkn))
        )
    if _input(node, 2) is not None:
        bias = cx.ref(_input(node, 2))
        if bias.size != d3 or bias.dtype != qkv.dtype:
            cx.decline("Attention bias of another size")
        lines += elementwise(cx.tag, qkv, [qkv, bias], [("Add", {}, (-1, 1))], 0)
    return lines


def _attention_products(
    cx: Any, qkv: Ref, sc: Ref, y: Ref, sizes: tuple[int, int, int], scale: float
) -> tuple[list[str], list[str]]:
    """The lines of one head's scores ``scale q k^T`` into ``sc`` and of its product by V
    into ``y`` (``sizes``: S, D, head size): gemm calls on strided views with BLAS, else
    ``emit.matmul``'s loops over a transposed, scaled copy of the keys."""
    s_, d, hq = sizes
    g, S, D, HQ = cx.tag, literal(s_), literal(d), literal(hq)
    D3 = literal(3 * d)
    base = f"{qkv.off} + bb * {literal(s_ * 3 * d)} + hh * {HQ}"
    y_at = f"{y.off} + bb * {literal(s_ * d)} + hh * {HQ}"
    if cx.blas:
        # the heads are strided views of the projection and of the output (leading
        # dimensions 3d and d): gemm reads and writes them in place, k transposed by BLAS
        scores = [f"gemm_f4_ld({qkv.buf}, {base}, {D3}, {qkv.buf}, {base} + {D}, {D3}, True, "
                  f"{sc.buf}, {sc.off}, {S}, {S}, {HQ}, {S}, {literal(scale)})"]  # fmt: skip
        product = [f"gemm_f4_ld({sc.buf}, {sc.off}, {S}, {qkv.buf}, {base} + {literal(2 * d)}, "
                   f"{D3}, False, {y.buf}, {y_at}, {D}, {S}, {S}, {HQ}, 1.0)"]  # fmt: skip
        return scores, product
    kt = cx.new_buffer((hq, s_), y.dtype)  # one head's keys, transposed and scaled
    oh = cx.new_buffer((s_, hq), y.dtype)  # one head's output rows
    # per head, the products through emit.matmul (its vectorized loops): q is a strided
    # view of the projection (rows 3d apart), the keys are scaled as they are transposed
    qh = Ref(qkv.buf, base, (s_, hq), y.dtype, qkv.root)
    vh = Ref(qkv.buf, f"{base} + {literal(2 * d)}", (s_, hq), y.dtype, qkv.root)
    transpose = [f"for i in range({S}):",
                 f"    for dd in range({HQ}):",
                 f"        {kt.buf}[{kt.off} + dd * {S} + i] = "
                 f"{qkv.buf}[{base} + {D} + i * {D3} + dd] * f4({literal(scale)})"]  # fmt: skip
    scores = transpose + matmul(f"{g}s_", qh, kt, sc, (s_, hq, s_), (3 * d, 1), (s_, 1),
                                blas=False)  # fmt: skip
    copy = [f"for i in range({S}):",
            f"    for dd in range({HQ}):",
            f"        {y.buf}[{y_at} + i * {D} + dd] = "
            f"{oh.buf}[{oh.off} + i * {HQ} + dd]"]  # fmt: skip
    product = matmul(f"{g}v_", sc, vh, oh, (s_, s_, hq), (s_, 1), (3 * d, 1), blas=False) + copy
    return scores, product


def _attention_heads(
    cx: Any,
    sc: Ref,
    mask: Ref | None,
    dims: tuple[int, int, int],
    fill: float,
    scores: list[str],
    product: list[str],
) -> list[str]:
    """The loop over batch rows and heads (``dims``: B, S, heads): the scores, the mask
    (``fill`` added to the keys at or after the row's end), the softmax (max, one flat
    ``expf`` loop, sum and scale), the product."""
    b_, s_, heads = dims
    g, S = cx.tag, literal(s_)
    end = f"min(max(i8({mask.buf}[{mask.off} + bb]), 0), {S})" if mask is not None else S

    def score(j: str) -> str:
        return f"{sc.buf}[{sc.off} + i * {S} + {j}]"

    return [f"for bb in range({literal(b_)}):", f"    {g}end = {end}",
            f"    for hh in range({literal(heads)}):",
            *["        " + ln for ln in scores],
            f"        for i in range({S}):",
            f"            for j in range({g}end, {S}):",
            f"                {sc.buf}[{sc.off} + i * {S} + j] += f4({literal(fill)})",
            *["            " + ln for ln in lane_reduce(f"{g}mx", s_, score, "max", "f4")],
            f"            for j in range({S}):",
            f"                {sc.buf}[{sc.off} + i * {S} + j] -= {g}mx",
            # the exponentials in one flat loop without a reduction: LLVM vectorizes it
            f"        for q in range({literal(s_ * s_)}):",
            f"            {sc.buf}[{sc.off} + q] = expf_neg({sc.buf}[{sc.off} + q])",
            f"        for i in range({S}):",
            *["            " + ln for ln in lane_reduce(f"{g}sum", s_, score, "sum", "f4")],
            f"            {g}r = f4(1.0) / {g}sum",
            f"            for j in range({S}):",
            f"                {sc.buf}[{sc.off} + i * {S} + j] *= {g}r",
            *["        " + ln for ln in product]]  # fmt: skip


_MS = "com.microsoft"


def register_lowerings(reg: Registry) -> None:
    """The transformer ops lowered here (none has a row rule: rows mode declines them)."""
    reg.add("", "Split", _split)
    reg.add("", "GatherND", _gather_nd)
    reg.add("", "SimplifiedLayerNormalization", _norm)
    reg.add(_MS, "SkipLayerNormalization", _skip_norm)
    reg.add(_MS, "SkipSimplifiedLayerNormalization", _skip_norm)
    reg.add(_MS, "BiasGelu", _gelu_like)
    reg.add(_MS, "FastGelu", _gelu_like)
    reg.add(_MS, "FusedMatMul", _fused_matmul)
    reg.add(_MS, "EmbedLayerNormalization", embed_norm)
    reg.add(_MS, "Attention", _attention)
    for op in _LOGIC:
        reg.add("", op, _logic)
    reg.add("", "Expand", _expand)
    reg.add("", "Tile", _tile)
    reg.add("", "LayerNormalization", _norm)
    reg.add("", "RMSNormalization", _norm)


def batched_matmul(cx: Any, node: Node) -> list[str] | None:
    """The batched form of MatMul when both operands are stacks of matrices (None: the 2-D
    weights form applies)."""
    b = cx.stack_ref(node.inputs[1])
    if len(b.shape) <= 2:
        return None
    return _batched_matmul(cx, node)
