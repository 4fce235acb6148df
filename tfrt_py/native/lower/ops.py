"""Lowerings of the default domain's ops and the fused ops: node -> lines of numba code.

``register_lowerings`` adds a record per op (``records.OpLowering``: the emitter, its row
rule, ...) to the registry. An emitter ``emit(cx, node)`` returns the node's code, reading
its inputs and writing its outputs through ``cx`` (a ``context.NodeContext``: ``ref``,
``out``, ``const``, ``put_const``, ``decline``, ``tag``, ``blas``). An emitter that meets
a case it does not handle calls ``cx.decline(reason)``; the model then stays on the
interpreter and ``describe()`` shows the reason. View ops (Reshape and friends) are
registered by ``registry``: the lowering makes their output its input's memory.

Runs at load on the loading thread; pure functions of the node.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...ir import Node
from ...kernels.fused.domain import DOMAIN
from ...kernels.lib.softmax_jit import SHORT_ROW
from . import rows
from .cache import concat_in_place
from .emit import EXP_IMPORT, Step, chains, copy_strided, elementwise, matmul, tname
from .loops import Ref, lane_reduce, loop_nest, strides
from .ops_tx import batched_matmul
from .products import packed_product, weights_product
from .records import Registry
from .scalar import SCALAR_OPS
from .source import literal

__all__ = ["linear_lines", "register_lowerings"]

_FLOATS = ("float32", "float64")


def _float(cx: Any, r: Ref) -> None:
    if str(r.dtype) not in _FLOATS:
        cx.decline(f"dtype {r.dtype} (native arithmetic is float32/float64 only)")


def _steps(cx: Any, raw: list[Any]) -> list[Step]:
    out: list[Step] = []
    for op, _opset, attrs, refs in raw:
        if op not in SCALAR_OPS:
            cx.decline(f"fused step {op} has no native form")
        out.append((op, dict(attrs), tuple(refs)))
    return out


#: Elementwise ops lowered on integers too: their wraparound is NumPy's (a box's position
#: arithmetic, ``generic.py``: relative positions, a T5's buckets).
_INT_OPS = frozenset({"Add", "Sub", "Mul", "Abs", "Neg", "Max", "Min"})


#: Variadic ops and their pairwise step: Sum(a, b, c) is ((a + b) + c), onnxruntime's order.
_VARIADIC = {"Sum": "Add", "Max": "Max", "Min": "Min"}


def _map(cx: Any, node: Node) -> list[str]:
    """A plain elementwise op: one step reading every input (a variadic Sum/Max/Min: a
    step a further input, in order, all broadcast together)."""
    y = cx.out(node.outputs[0])
    op = _VARIADIC.get(node.op_type, node.op_type)
    if not (op in _INT_OPS and str(y.dtype) in ("int64", "int32")):
        _float(cx, y)
    ins = [None if v is None else cx.ref(v) for v in node.inputs]
    for r in ins:
        if r is not None and r.dtype != y.dtype:
            cx.decline(f"mixed dtypes {r.dtype} and {y.dtype}")
    if node.op_type in _VARIADIC:
        if not ins or None in ins:
            cx.decline(f"{node.op_type} with {len(ins)} inputs")
        steps: list[Step] = [("Identity", {}, (0,))] if len(ins) == 1 else [(op, {}, (0, 1))]
        steps += [(op, {}, (-1, k)) for k in range(2, len(ins))]
        return elementwise(cx.tag, y, ins, steps, None)
    if op in ("Add", "Mul", "Sub", "Div", "Pow") and len(ins) != 2:
        cx.decline(f"{node.op_type} with {len(ins)} inputs")
    step: Step = (node.op_type, dict(node.attrs), tuple(range(len(ins))))
    if op == "Pow" and _squares(cx, node, ins[0], y):
        step = ("Mul", {}, (0, 0))
    return elementwise(cx.tag, y, ins, [step], None)


def _squares(cx: Any, node: Node, base: Ref | None, y: Ref) -> bool:
    """Whether a Pow raises its base to a constant exponent of one element, 2, into the
    base's shape: then it is the base times itself, as onnxruntime computes it (its Pow
    takes ``x * x`` for an exponent of 2; libm's ``powf``, which numba's ``**`` calls,
    differs in the last bit for ~1 float in 1,000 and costs a call per element: a
    GaussianNB's 60 squares a row, 0.5 µs). (Elementwise chains hold no Pow.)"""
    e = None if node.inputs[1] is None else cx.const(node.inputs[1])
    return (
        base is not None and base.shape == y.shape
        and e is not None and e.size == 1 and float(e.reshape(-1)[0]) == 2.0
    )  # fmt: skip


def _chain(cx: Any, node: Node) -> list[str]:
    y = cx.out(node.outputs[0])
    _float(cx, y)
    ins = [None if v is None else cx.ref(v) for v in node.inputs]
    return elementwise(cx.tag, y, ins, _steps(cx, list(node.attrs["steps"])), 0)


def _linear(cx: Any, node: Node) -> list[str]:
    x, wc = cx.ref(node.inputs[0]), cx.const(node.inputs[1])
    shape = wc.shape if wc is not None else cx.ref(node.inputs[1]).shape
    y = cx.out(node.outputs[0])
    _float(cx, y)
    if len(shape) != 2 or not x.shape or x.shape[-1] != shape[0]:
        cx.decline(f"shapes {x.shape} x {shape}")
    k, n = shape
    ins: list[Ref | None] = [None if v is None or i == 1 else cx.ref(v)
                             for i, v in enumerate(node.inputs)]  # fmt: skip
    # a constant weight goes to the packed kernel where it applies, stored only packed;
    # a bias and a ReLU, the whole epilogue, are applied as it stores
    bias = ins[2] if len(ins) > 2 else None
    act = [op for op, _at, _refs in _steps(cx, list(node.attrs.get("activation", [])))]
    if act in ([], ["Relu"]) and (bias is not None or act):
        fused = packed_product(cx, x, wc, y, (x.size // k, k, n), k, bias, bool(act))
        if fused is not None:
            return fused
    product = packed_product(cx, x, wc, y, (x.size // k, k, n), k)
    w = cx.ref(node.inputs[1]) if product is None else None
    return linear_lines(cx, node, x, w, y, ins, product, chain=chains(wc, k))


def linear_lines(
    cx: Any, node: Node, x: Ref, w: Ref | None, y: Ref, ins: list[Ref | None],
    product: list[str] | None = None, *, chain: bool = False,
) -> list[str]:  # fmt: skip
    """A Linear node's code for these refs (``ins``: refs of its inputs after the weight,
    for the bias and the activation's extra operands): ``product`` (the product's lines
    when the caller made them) or the product by ``w`` (``emit.matmul``'s ``chain``), then
    the epilogue in place."""
    if product is not None:
        lines = list(product)
    else:
        assert w is not None
        k, n = w.shape
        lines = matmul(cx.tag, x, w, y, (x.size // k, k, n), (k, 1), (n, 1),
                       blas=cx.blas_for(x.size * n), chain=chain)  # fmt: skip
    steps = _steps(cx, list(node.attrs.get("activation", [])))
    if len(ins) > 2 and ins[2] is not None:
        steps.insert(0, ("Add", {}, (-1, 2)))
    if steps:
        ins = [y, None, *ins[2:]]  # operand 0 is the product itself, read back in place
        lines += elementwise(cx.tag, y, ins, steps, 0)
    return lines


def _matmul_like(cx: Any, node: Node, trans_a: bool, trans_b: bool) -> tuple[list[str], Ref]:
    a, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    _float(cx, y)
    return weights_product(cx, a, node.inputs[1], y, trans_a, trans_b), y


def _matmul(cx: Any, node: Node) -> list[str]:
    stacked = batched_matmul(cx, node)  # both operands stacks of matrices (attention)
    return stacked if stacked is not None else _matmul_like(cx, node, False, False)[0]


def _gemm(cx: Any, node: Node) -> list[str]:
    at = node.attrs
    lines, y = _matmul_like(cx, node, bool(at.get("transA", 0)), bool(at.get("transB", 0)))
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    steps: list[Step] = []
    ins: list[Ref | None] = [y, None]
    if alpha != 1.0:
        ins.append(cx.put_const(np.asarray([alpha], y.dtype)))
        steps.append(("Mul", {}, (-1, len(ins) - 1)))
    c_v = node.inputs[2] if len(node.inputs) > 2 else None
    if c_v is not None and beta != 0.0:
        if beta == 1.0:
            c = cx.ref(c_v)
        elif c_v.const is not None:
            c = cx.put_const(np.asarray(c_v.const * beta, y.dtype))
        else:
            cx.decline("Gemm with beta != 1 and a runtime C")
        ins.append(c)
        steps.append(("Add", {}, (-1, len(ins) - 1)))
    if steps:
        lines += elementwise(cx.tag, y, ins, steps, 0)
    return lines


def _softmax(cx: Any, node: Node) -> list[str]:
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    _float(cx, y)
    rank = len(x.shape)
    axis = int(node.attrs.get("axis", -1 if node.opset >= 13 else 1))
    axis += rank if axis < 0 else 0
    if node.opset >= 13:
        outer, n = math.prod(x.shape[:axis]), x.shape[axis]
        inner = math.prod(x.shape[axis + 1 :])
    else:
        outer, n, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis:]), 1
    t, g = tname(y.dtype), cx.tag
    log = node.op_type == "LogSoftmax"
    N, ROW, INNER = literal(n), literal(n * inner), literal(inner)

    def at(r: Ref, o: str, j: str, i: str) -> str:
        return f"{r.buf}[{r.off} + {o} * {ROW} + {j} * {INNER} + {i}]"

    def body(iv: list[str]) -> list[str]:
        o, i = iv
        lines = [f"{g}mx = {at(x, o, '0', i)}", f"for j in range(1, {N}):",
                 f"    {g}v = {at(x, o, 'j', i)}",
                 f"    if {g}v > {g}mx or {g}v != {g}v:", f"        {g}mx = {g}v",
                 f"{g}s = {t}(0.0)", f"for j in range({N}):"]  # fmt: skip
        if log:
            lines += [f"    {g}s += np.exp({at(x, o, 'j', i)} - {g}mx)",
                      f"{g}ls = {t}(np.log({g}s))", f"for j in range({N}):",
                      f"    {at(y, o, 'j', i)} = ({at(x, o, 'j', i)} - {g}mx) - {g}ls"]  # fmt: skip
        else:
            lines += [f"    {g}e = {t}(np.exp({at(x, o, 'j', i)} - {g}mx))",
                      f"    {at(y, o, 'j', i)} = {g}e", f"    {g}s += {g}e",
                      f"for j in range({N}):", f"    {at(y, o, 'j', i)} /= {g}s"]  # fmt: skip
        return lines

    if log or t != "f4":
        return loop_nest([outer, inner], body, "q")
    # float32, as the interpreter's softmax_jit: the max and the sum in independent
    # chains, the exponentials of x - max (<= 0) with fastmath.expf_neg (libm's expf is a
    # call per element)
    # in a loop LLVM vectorizes, the scaling by the sum's reciprocal. Rows longer than
    # SHORT_ROW take each pass while the row is in L1; shorter ones (a loop of a few
    # iterations does not vectorize) the exponentials over the whole input in one loop.
    cx.imports.add(EXP_IMPORT)
    by_row = inner == 1 and cx.choose(n > SHORT_ROW)  # (either form is right)
    # a long row's max and sum in vector registers (kernels/lib/rowreduce_ir), where the
    # kernels run here; else four scalar chains
    vec = by_row and _row_reductions(cx)

    def shift(iv: list[str]) -> list[str]:
        o, i = iv
        v = f"expf_neg({at(x, o, 'j', i)} - {g}mx)" if by_row else f"{at(x, o, 'j', i)} - {g}mx"
        mx = ([f"{g}mx = rowmax_f4({x.buf}, {x.off} + {o} * {ROW}, {N})"] if vec
              else lane_reduce(f"{g}mx", n, lambda j: at(x, o, j, i), "max", t))  # fmt: skip
        return [*mx, f"for j in range({N}):", f"    {at(y, o, 'j', i)} = {v}"]

    def scale(iv: list[str]) -> list[str]:
        o, i = iv
        total = ([f"{g}s = rowsum_f4({y.buf}, {y.off} + {o} * {ROW}, {N})"] if vec
                 else lane_reduce(f"{g}s", n, lambda j: at(y, o, j, i), "sum", t))  # fmt: skip
        return [*total, f"{g}r = {t}(1.0) / {g}s",
                f"for j in range({N}):", f"    {at(y, o, 'j', i)} *= {g}r"]  # fmt: skip

    if by_row:
        return loop_nest([outer], lambda iv: shift([iv[0], "0"]) + scale([iv[0], "0"]), "q")
    flat = [f"for q in range({literal(outer * n * inner)}):",
            f"    {y.buf}[{y.off} + q] = expf_neg({y.buf}[{y.off} + q])"]  # fmt: skip
    return [*loop_nest([outer, inner], shift, "q"), *flat, *loop_nest([outer, inner], scale, "q")]


#: The import line of a module whose code calls the row reductions (importing builds them).
ROWREDUCE_IMPORT = "from tfrt_py.kernels.lib.rowreduce_ir import rowmax_f4, rowsum_f4"


def _row_reductions(cx: Any) -> bool:
    """Whether this module's long float32 softmax rows take ``rowmax_f4``/``rowsum_f4``
    (their import added): where the kernels run in this process."""
    from ...kernels.lib import rowreduce_ir

    if rowreduce_ir.kernels() is None:
        return False
    cx.imports.add(ROWREDUCE_IMPORT)
    return True


#: How each accumulating reduction folds an element ``v`` into ``acc`` (ReduceMax/Min
#: compare instead) and what it stores from ``acc`` over ``n`` elements: ONNX's
#: definitions, accumulated in the output's float type in order as onnxruntime does (a
#: square rounded before it is added, not fused into the sum: ``rounded``).
ROUNDED_IMPORT = "from tfrt_py.native.kernels.fastmath import rounded"
_REDUCE_STEPS = {
    "ReduceSum": "+= {v}", "ReduceMean": "+= {v}", "ReduceSumSquare": "+= rounded({v} * {v})",
    "ReduceL1": "+= abs({v})", "ReduceL2": "+= rounded({v} * {v})", "ReduceLogSum": "+= {v}",
    "ReduceProd": "*= {v}",
}  # fmt: skip
_REDUCE_RESULTS = {
    "ReduceMean": "{acc} / {n}", "ReduceL2": "np.sqrt({acc})", "ReduceLogSum": "np.log({acc})",
    # an infinite (or NaN) maximum is the result itself: inf - inf would make a NaN
    "ReduceLogSumExp": "np.log({acc}) + {mx} if abs({mx}) < np.inf else {mx}",
}  # fmt: skip
_REDUCE_OPS = ("ReduceMax", "ReduceMin", "ReduceLogSumExp", *_REDUCE_STEPS)


def _reduce(cx: Any, node: Node) -> list[str]:
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    integer = node.op_type == "ReduceSum" and str(y.dtype) in ("int64", "int32")
    if not integer:  # (an integer sum: a mask's length, which wraps as NumPy's does)
        _float(cx, y)
    rank = len(x.shape)
    axes_in = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_in is not None:
        if axes_in.const is None:
            cx.decline("axes given at run time")
        axes = [int(a) for a in np.asarray(axes_in.const).ravel()]
    else:
        axes = [int(a) for a in node.attrs.get("axes", [])]
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return copy_strided(y, x, strides(x.shape))
        axes = list(range(rank))
    axes = sorted({a + rank if a < 0 else a for a in axes})
    kept = [d for d in range(rank) if d not in axes]
    if math.prod(x.shape[d] for d in kept) != y.size:
        # the kernel read the axes otherwise (an opset before 18 ignores an axes input):
        # the loops would write past the output
        cx.decline(f"reducing {x.shape} over axes {axes} does not give {y.shape}")
    st = strides(x.shape)
    t, g, op = tname(y.dtype), cx.tag, node.op_type
    count = math.prod(x.shape[a] for a in axes)
    ost = strides([x.shape[d] for d in kept])

    def body(kv: list[str]) -> list[str]:
        base = " + ".join([x.off] + [f"{v} * {literal(st[d])}" for v, d in zip(kv, kept)])
        zero = f"{t}(0)" if integer else f"{t}(0.0)"
        init = {"ReduceMax": f"{t}(-np.inf)", "ReduceMin": f"{t}(np.inf)",
                "ReduceProd": f"{t}(1.0)"}.get(op, zero)  # fmt: skip
        # the reduction's loop indices are tagged per node: a bare "r0" would be the
        # output view r0 (numba: "Cannot unify array(float32, 1d, C) and int64")
        inner = [f"{g}v = {x.buf}[{base} + " + " + ".join(
            f"{g}r{j} * {literal(st[a])}" for j, a in enumerate(axes)) + "]"]  # fmt: skip
        step = _REDUCE_STEPS.get(op)
        if op == "ReduceLogSumExp":
            pass  # its two loops are written below
        elif step is not None:
            if "rounded" in step:
                cx.imports.add(ROUNDED_IMPORT)
            inner.append(f"{g}acc " + step.format(v=f"{g}v"))
        else:
            cmp = ">" if op == "ReduceMax" else "<"
            inner += [f"if {g}v {cmp} {g}acc or {g}v != {g}v:", f"    {g}acc = {g}v"]
        lines = [f"{g}acc = {init}"]
        if op == "ReduceLogSumExp":  # max first: log(sum(exp(v - max))) + max, as onnxruntime
            at = inner[0].split(" = ", 1)[1]
            lines = [f"{g}mx = {t}(-np.inf)"]
            lines += loop_nest([x.shape[a] for a in axes], lambda _: [
                f"{g}v = {at}", f"if {g}v > {g}mx or {g}v != {g}v:", f"    {g}mx = {g}v",
            ], f"{g}r")  # fmt: skip
            lines.append(f"{g}acc = {t}(0.0)")
            exp = "expf_rn" if t == "f4" else "np.exp"  # libm's values, vectorizable
            inner = [inner[0], f"{g}acc += {exp}({g}v - {g}mx)"]
        lines += loop_nest([x.shape[a] for a in axes], lambda _: inner, f"{g}r")
        res = _REDUCE_RESULTS.get(op, "{acc}").format(
            acc=f"{g}acc", n=f"{t}({literal(count)})", mx=f"{g}mx"
        )
        pos = " + ".join([y.off] + [f"{v} * {literal(s)}" for v, s in zip(kv, ost)])
        lines.append(f"{y.buf}[{pos}] = {res}")
        return lines

    return loop_nest([x.shape[d] for d in kept], body, "p")


def _concat(cx: Any, node: Node) -> list[str]:
    y = cx.out(node.outputs[0])
    if y.mat:  # a KV cache's present, written in place
        return concat_in_place(cx, node, y)
    axis = int(node.attrs["axis"])
    axis += len(y.shape) if axis < 0 else 0
    outer = math.prod(y.shape[:axis])
    inner = math.prod(y.shape[axis + 1 :])
    row = y.shape[axis] * inner
    lines: list[str] = []
    pos = 0
    for v in node.inputs:
        if v is None:
            continue
        x = cx.ref(v)
        if x.dtype != y.dtype:
            cx.decline("Concat of mixed dtypes")
        width = x.shape[axis] * inner
        if width == 0:
            continue
        dst = Ref(y.buf, f"{y.off} + {literal(pos)}", (outer, width), y.dtype, y.root)
        lines += _copy_rows(dst, x, outer, width, row)
        pos += width
    return lines


def _copy_rows(dst: Ref, src: Ref, outer: int, width: int, row: int) -> list[str]:
    W, ROW = literal(width), literal(row)
    if outer == 1:
        return [
            f"for c in range({W}):",
            f"    {dst.buf}[{dst.off} + c] = {src.buf}[{src.off} + c]",
        ]
    return [
        f"for o in range({literal(outer)}):",
        f"    for c in range({W}):",
        f"        {dst.buf}[{dst.off} + o * {ROW} + c] = {src.buf}[{src.off} + o * {W} + c]",
    ]


def _slice(cx: Any, node: Node) -> list[str]:
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    rank = len(x.shape)
    if node.opset < 10:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes", list(range(len(starts)))), [1] * len(starts)
    else:
        vals = [cx.const(v) if v is not None else None for v in node.inputs[1:5]]
        if any(v is None for v in vals[:2]) or any(
            node.inputs[i] is not None and vals[i - 1] is None
            for i in range(3, min(5, len(node.inputs)))
        ):
            cx.decline("starts/ends/axes/steps given at run time")
        starts, ends = [int(s) for s in vals[0]], [int(e) for e in vals[1]]  # type: ignore[union-attr]
        axes = [int(a) for a in vals[2]] if len(vals) > 2 and vals[2] is not None else list(
            range(len(starts)))  # fmt: skip
        steps = [int(s) for s in vals[3]] if len(vals) > 3 and vals[3] is not None else [1] * len(
            starts)  # fmt: skip
    begin, step = [0] * rank, [1] * rank
    for s, e, a, k in zip(starts, ends, axes, steps):
        a += rank if a < 0 else 0
        b, _, kk = slice(s, e, k).indices(x.shape[a])
        begin[a], step[a] = b, kk
    st = strides(x.shape)
    base = sum(b * s for b, s in zip(begin, st))
    return copy_strided(y, x, [s * k for s, k in zip(st, step)], base)


def _transpose(cx: Any, node: Node) -> list[str]:
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    rank = len(x.shape)
    perm = node.attrs.get("perm", list(range(rank))[::-1])
    st = strides(x.shape)
    return copy_strided(y, x, [st[p] for p in perm])


def _gather(cx: Any, node: Node) -> list[str]:
    data, idx, y = cx.ref(node.inputs[0]), cx.ref(node.inputs[1]), cx.out(node.outputs[0])
    if str(idx.dtype) not in ("int64", "int32"):
        cx.decline(f"indices of dtype {idx.dtype}")
    axis = int(node.attrs.get("axis", 0))
    axis += len(data.shape) if axis < 0 else 0
    outer, dim = math.prod(data.shape[:axis]), data.shape[axis]
    inner = math.prod(data.shape[axis + 1 :])
    g = cx.tag
    D, INNER = literal(dim), literal(inner)
    return [
        f"for q in range({literal(idx.size)}):",
        f"    {g}t = {idx.buf}[{idx.off} + q]",
        f"    if {g}t < 0:",
        f"        {g}t += {D}",
        f"    if {g}t < 0 or {g}t >= {D}:",
        "        raise IndexError('Gather index out of range')",
        f"    for o in range({literal(outer)}):",
        f"        for c in range({INNER}):",
        f"            {y.buf}[{y.off} + o * {literal(idx.size * inner)} + q * {INNER} + c] = "
        f"{data.buf}[{data.off} + o * {literal(dim * inner)} + {g}t * {INNER} + c]",
    ]


def _cast(cx: Any, node: Node) -> list[str]:
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    ints = ("int64", "int32")
    to_bool = str(y.dtype) == "bool"
    ok = x.dtype == y.dtype or to_bool or str(y.dtype) in _FLOATS or str(y.dtype) in ints
    if not ok:
        cx.decline(f"Cast {x.dtype} -> {y.dtype} (native casts to numbers and bools)")
    t = tname(y.dtype)
    src = f"{x.buf}[{x.off} + i0]"
    val = f"{src} != 0" if to_bool and str(x.dtype) != "bool" else src  # NaN -> True, as NumPy
    if str(x.dtype) in _FLOATS and str(y.dtype) in ints:
        # A NaN, an infinity or a value out of the int's range would be undefined in LLVM
        # (poison, which a later bounds check on the result may not survive: a request's
        # NaN must not become an index). Defined here as x86 and NumPy make it: the
        # type's minimum.
        bits = 63 if str(y.dtype) == "int64" else 31
        lo, hi, low = literal(-(2.0**bits)), literal(2.0**bits), literal(-(2**bits))
        val = f"({t}({src}) if {lo} <= {src} < {hi} else {t}({low}))"
        return loop_nest([x.size], lambda iv: [f"{y.buf}[{y.off} + i0] = {val}"])
    line = f"{y.buf}[{y.off} + i0] = {t}({val})"
    return loop_nest([x.size], lambda iv: [line])


def _range(cx: Any, node: Node) -> list[str]:
    """Range of known start and delta (a box of dims keeps a length-dependent one as code,
    ``generic.py``): ``start + i * delta``."""
    known = [cx.const(v) if v is not None else None for v in node.inputs[:3]]
    if len(known) != 3 or any(k is None or k.size != 1 for k in known):
        cx.decline("Range of values known only at run time")
    start, limit, delta = (k.reshape(-1)[0] for k in known)  # type: ignore[union-attr]
    y = cx.out(node.outputs[0])
    if delta == 0 or y.size != max(math.ceil((limit - start) / delta), 0):
        cx.decline("Range whose length is not the probe's")
    t = tname(y.dtype)
    line = f"{y.buf}[{y.off} + i0] = {t}({literal(start.item())} + i0 * {literal(delta.item())})"
    return loop_nest([y.size], lambda iv: [line])


def _constant_of_shape(cx: Any, node: Node) -> list[str]:
    """ConstantOfShape of a known shape: a fill (``generic.py`` keeps a length-dependent
    one as code)."""
    y = cx.out(node.outputs[0])
    v = node.attrs.get("value")
    value = np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)
    if value.size != 1 or value.dtype != y.dtype or value.dtype.kind not in "biuf":
        cx.decline(f"ConstantOfShape value {value.dtype}[{value.size}]")
    t = tname(y.dtype)
    fill = f"{t}({literal(value[0].item())})"
    return loop_nest([y.size], lambda iv: [f"{y.buf}[{y.off} + i0] = {fill}"])


def _steps_weight(node: Node) -> int:
    steps = node.attrs.get("steps")
    return len(steps) if isinstance(steps, (list, tuple)) else 1


def register_lowerings(reg: Registry) -> None:
    """The default domain's ops and the fused ops lowered here, with their row rules."""
    # a run of Linear layers may become one stacked loop (runs.py): no lower bound
    reg.add(DOMAIN, "Linear", _linear, rows=rows.only_first, product=True, weight=0)
    for op in ("ElementwiseChain", "ElementwiseChainShared"):
        reg.add(DOMAIN, op, _chain, rows=rows.any_rows, weight=_steps_weight)
    reg.add("", "MatMul", _matmul, rows=rows.only_first, product=True)
    reg.add("", "Gemm", _gemm, rows=rows.gemm, product=True)
    reg.add("", "Softmax", _softmax, rows=rows.softmax)
    reg.add("", "LogSoftmax", _softmax, rows=rows.softmax)
    reg.add("", "Concat", _concat, rows=rows.concat)
    reg.add("", "Slice", _slice, rows=rows.slice_)
    reg.add("", "Transpose", _transpose, rows=rows.transpose)
    reg.add("", "Gather", _gather, rows=rows.gather)
    reg.add("", "Cast", _cast, rows=rows.any_rows)
    reg.add("", "Range", _range, rows=rows.any_rows)
    reg.add("", "ConstantOfShape", _constant_of_shape, rows=rows.any_rows)
    for op in _REDUCE_OPS:
        reg.add("", op, _reduce, rows=rows.reduce)
    for op in SCALAR_OPS:
        if op != "Identity":  # a view (registry.VIEW_OPS)
            reg.add("", op, _map, rows=rows.any_rows)
    reg.add("", "Sum", _map, rows=rows.any_rows)
