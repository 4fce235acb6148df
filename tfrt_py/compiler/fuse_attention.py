"""The attention patterns of ``fuse_transformer``: scores ``MatMul(A, Transpose(B))`` as a
``tfrt_py.fused::MatMulTransB`` node (one-element scalings of A and B as its alpha
inputs; a scalar ``Mul`` after the Transpose moved before it first), and ``MatMul(Softmax(
MatMulTransB(Q, K) [* s]), V)`` as a ``tfrt_py.fused::SoftmaxAttention`` node. The
module docstring of ``fuse_transformer`` states the patterns' conditions; same contract
(every intermediate read inside its pattern only). Pure graph rewriting, on the loading
thread.
"""

from __future__ import annotations

from typing import Any

from ..ir import Graph, Node, Value
from ..kernels.fused.domain import DOMAIN
from .rewrite import Uses

__all__ = ["fuse_attention", "matmul_transb", "move_scalar_mul_before_transpose"]


def _swaps_last_two(node: Node) -> bool:
    perm = node.attrs.get("perm")
    if node.op_type != "Transpose" or node.domain != "" or perm is None or len(perm) < 2:
        return False
    r = len(perm)
    return list(perm) == [*range(r - 2), r - 1, r - 2]


def matmul_transb(mm: Node, uses: Uses) -> tuple[str, Node, list[Node]] | None:
    if len(mm.inputs) != 2 or len(mm.outputs) != 1:
        return None
    a, bt = mm.inputs
    tr = None if bt is None else bt.producer
    if a is None or tr is None or not _swaps_last_two(tr) or uses.only_reader(bt) is not mm:  # type: ignore[arg-type]
        return None
    b = tr.inputs[0]
    if b is None:
        return None
    a, sa, mul_a = _scaled(a, mm, uses)
    b, sb, mul_b = _scaled(b, tr, uses)
    scales = [sa, sb] if sa is not None or sb is not None else []
    new = Node(
        "MatMulTransB",
        [a, b, *scales],
        list(mm.outputs),
        {},
        name=f"{mm.name}/transb",
        domain=DOMAIN,
        opset=1,
    )
    return "MatMulTransB", new, [m for m in (mul_a, mul_b) if m is not None] + [tr, mm]


def fuse_attention(graph: Graph) -> int:
    """``MatMul(Softmax(MatMulTransB(Q, K, ...) [* s]), V)`` -> ``SoftmaxAttention(Q, K, V,
    sa, sb, [s])`` where each intermediate is read by the next node alone (and is not a
    graph output), ``s`` (scores scaled after the product, ``(q @ k^T) * scale``) holds
    one element of the scores' float type, and the Softmax runs over the last axis of
    float32 scores of known rank (opset 13's ``axis``, or an older opset's flattening from
    the last axis: the same). Returns how many were replaced."""
    uses = Uses(graph)
    replaced: dict[int, Node | None] = {}
    for sm in graph.nodes:
        if sm.op_type != "Softmax" or sm.domain != "" or len(sm.inputs) != 1 or not sm.outputs:
            continue
        scores, probs = sm.inputs[0], sm.outputs[0]
        if scores is None or probs is None or uses.only_reader(scores) is not sm:
            continue
        rank = getattr(scores.type, "rank", None)
        if rank is None or rank < 3 or str(getattr(scores.type, "dtype", "")) != "float32":
            continue
        axis = int(sm.attrs.get("axis", -1 if sm.opset >= 13 else 1))
        if axis % rank != rank - 1:
            continue
        found = _scores(scores, uses, rank)
        mm = uses.only_reader(probs)
        if found is None or mm is None or mm.op_type != "MatMul" or mm.domain != "":
            continue
        if len(mm.inputs) != 2 or mm.inputs[0] is not probs or mm.inputs[1] is None:
            continue
        qk, mul, post = found
        scales = list(qk.inputs[2:4])  # sa, sb: none, or both slots (None where absent)
        if post is not None:
            scales = [*scales, *[None] * (2 - len(scales)), post]
        new = Node(
            "SoftmaxAttention",
            [qk.inputs[0], qk.inputs[1], mm.inputs[1], *scales],
            list(mm.outputs),
            {},
            name=f"{mm.name}/attention",
            domain=DOMAIN,
            opset=1,
        )
        for gone in (qk, mul, sm):
            if gone is not None:
                replaced[id(gone)] = None
        replaced[id(mm)] = new
    graph.nodes = [r for r in (replaced.get(id(nd), nd) for nd in graph.nodes) if r is not None]
    return sum(1 for r in replaced.values() if r is not None)


def _scores(scores: Value, uses: Uses, rank: int) -> tuple[Node, Node | None, Value | None] | None:
    """(the MatMulTransB, the Mul scaling its output or None, the one-element scale or
    None) when ``scores`` is ``MatMulTransB(...)`` or ``MatMulTransB(...) * s``."""
    node = scores.producer
    if node is None:
        return None
    if node.op_type == "MatMulTransB" and node.domain == DOMAIN:
        return node, None, None
    if node.op_type != "Mul" or node.domain != "" or len(node.inputs) != 2:
        return None
    for i in (0, 1):
        x, s = node.inputs[i], node.inputs[1 - i]
        qk = None if x is None else x.producer
        if x is None or s is None or qk is None or qk.op_type != "MatMulTransB":
            continue
        if qk.domain != DOMAIN or uses.only_reader(x) is not node:
            continue
        if _one_element(s, rank) and _same_float(x, s):
            return qk, node, s
    return None


def _scaled(v: Value, reader: Node, uses: Uses) -> tuple[Value, Value | None, Node | None]:
    """(x, s, the Mul) when ``v`` is ``Mul(x, s)`` by one element ``s`` (scaled dot-product
    attention's exports scale Q and K by sqrt(scale) each) read by ``reader`` alone and
    not a graph output: the product applies ``s`` as its BLAS alpha instead of a pass
    over the operand. Else (v, None, None)."""
    mul = v.producer
    if mul is None or mul.op_type != "Mul" or mul.domain != "" or len(mul.inputs) != 2:
        return v, None, None
    if uses.only_reader(v) is not reader or uses.is_output(v):
        return v, None, None
    for i in (0, 1):
        x, s = mul.inputs[i], mul.inputs[1 - i]
        if x is None or s is None or x.type is None:
            continue
        if _one_element(s, getattr(x.type, "rank", None)) and _same_float(x, s):
            return x, s, mul
    return v, None, None


def _same_float(x: Value, s: Value) -> bool:
    """Both float32 or both float64 (the scaled operand's dtype does not change). In
    float16/bfloat16 scaling the operands first rounds differently enough to matter."""
    tx = getattr(x.type, "dtype", None)
    ts = s.const.dtype if s.const is not None else getattr(s.type, "dtype", None)
    return tx is not None and ts is not None and str(tx) == str(ts) in ("float32", "float64")


def move_scalar_mul_before_transpose(graph: Graph) -> int:
    """``Mul(Transpose(k), s)`` with ``s`` one element (a constant, or a computed value
    whose static shape is all ones and of no higher rank than ``k``) and the Transpose's
    output read by the Mul alone becomes ``Transpose(Mul(k, s))``: the same values, and the
    Transpose meets the MatMul. The Mul keeps its place (``s`` may be computed after the
    Transpose); the Transpose moves to just after it."""
    uses = Uses(graph)
    moves: list[tuple[Node, Node]] = []
    for mul in graph.nodes:
        if mul.op_type != "Mul" or mul.domain != "" or len(mul.inputs) != 2:
            continue
        for i in (0, 1):
            t, s = mul.inputs[i], mul.inputs[1 - i]
            tr = None if t is None else t.producer
            if t is None or tr is None or s is None or not _swaps_last_two(tr):
                continue
            k, y = tr.inputs[0], mul.outputs[0]
            if uses.only_reader(t) is not mul or k is None or y is None or k.type is None:
                continue
            if not _one_element(s, getattr(k.type, "rank", None)):
                continue
            # The Mul now reads k and writes t (k's type); the Transpose reads t, writes y.
            mul.inputs = [k, s] if i == 0 else [s, k]
            mul.outputs = [t]
            t.type, t.producer = k.type, mul
            tr.inputs, tr.outputs = [t], [y]
            y.producer = tr
            moves.append((mul, tr))
            break
    for mul, tr in moves:
        graph.nodes.remove(tr)
        graph.nodes.insert(graph.nodes.index(mul) + 1, tr)
    return len(moves)


def _one_element(v: Value, rank: int | None) -> bool:
    """``v`` holds one element and broadcasting it does not add axes to a rank-``rank``
    tensor."""
    if v.const is not None:
        shape: Any = v.const.shape
    else:
        shape = getattr(v.type, "shape", None)
    if shape is None or rank is None or len(shape) > rank:
        return False
    return all(d == 1 for d in shape)
