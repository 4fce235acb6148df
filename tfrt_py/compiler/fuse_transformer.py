"""Recognize the decomposed transformer patterns torch.onnx writes and replace each with
one op whose kernel runs it in a few passes:

* GELU, erf form ``x * 0.5 * (1 + erf(x / sqrt 2))`` (any association of the three
  factors; ``x * (1 / sqrt 2)`` too) and tanh form ``x * 0.5 * (1 + tanh(sqrt(2/pi) *
  (x + 0.044715 * x^3)))`` (``Pow(x, 3)`` or ``x * x * x``): an ONNX ``Gelu`` node
  (opset 20, ``approximate`` none or tanh), which ``fuse_linear`` may then fuse into the
  preceding Linear as its activation;
* SiLU ``x * Sigmoid(x)``: an ONNX ``Swish`` node (opset 24, alpha 1), which
  ``fuse_linear`` may fuse into the preceding Linear;
* LayerNorm ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) [* gamma] [+ beta]`` over
  the last axis (ReduceMean with axes as attribute or input; ``Pow(d, 2)`` or ``d * d``;
  ``Div`` by the Sqrt or ``Mul`` by its Reciprocal): an ONNX ``LayerNormalization`` node
  (opset 17, axis -1, stash type float32 as the decomposition computes);
* RMS norm (T5's LayerNorm) ``x * (1 / sqrt(mean(x^2) + eps)) [* gamma]`` over the last
  axis (``Pow(x, 2)`` or ``x * x``; ``Div(1, s)``, ``Reciprocal(s)`` or ``Div(x, s)``;
  either operand order of the Muls): an ONNX ``RMSNormalization`` node (opset 23, axis
  -1, stash type x's float type);
* attention scores ``MatMul(A, Transpose(B))`` (``fuse_attention.py``, as the next)
  whose Transpose swaps the last two axes only: a ``tfrt_py.fused::MatMulTransB`` node,
  whose kernel hands BLAS the transposed view (no copy). A scalar scaling between them,
  ``Mul(Transpose(B), s)``, moves before the Transpose first (elementwise, so the values
  are exactly the same); one-element scalings of A and of B (scaled dot-product
  attention's sqrt(scale) on Q and K) become the node's optional third and fourth
  inputs, applied as the product's alpha;
* attention without a mask, ``MatMul(Softmax(MatMulTransB(Q, K) [* s]), V)`` with the
  Softmax over the last axis: a ``tfrt_py.fused::SoftmaxAttention(Q, K, V, [sa, sb, s])``
  node, whose
  kernel (``kernels/lib/sdpa.py``) runs blocks of query rows through the three steps while
  their scores are in cache instead of writing the whole score tensor and reading it back
  twice;
* the rotate-half rotary embedding of Llama-style decoders (``fuse_rotary.py``, first): a
  ``tfrt_py.fused::RotaryHalf(x, cos, sin, h)`` node.

Every intermediate value must be read inside its pattern only (and not be a graph output);
constants must match to float32 precision. The replacement takes the pattern's last
node's output Value and place, so names and types are unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir import Graph, Node, Value
from ..kernels.fused.domain import DOMAIN
from .context import PassContext
from .fuse_attention import fuse_attention, matmul_transb, move_scalar_mul_before_transpose
from .fuse_rotary import fuse_rotary
from .rewrite import Uses

__all__ = ["fuse_transformer"]


def fuse_transformer(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    counts = {
        "GELU": 0, "SiLU": 0, "LayerNorm": 0, "RMSNorm": 0, "MatMulTransB": 0,
        "SoftmaxAttention": 0, "RotaryHalf": 0,
    }  # fmt: skip
    n_moved = move_scalar_mul_before_transpose(graph)
    counts["RotaryHalf"] = fuse_rotary(graph)
    uses = Uses(graph)
    replaced: dict[int, Node | None] = {}
    for node in graph.nodes:
        if id(node) in replaced:
            continue
        found: tuple[str, Node, list[Node]] | None = None
        if node.op_type in ("Erf", "Tanh") and node.domain == "":
            found = _gelu(node, uses)
        elif node.op_type == "ReduceMean" and node.domain == "":
            found = _layer_norm(node, uses) or _rms_norm(node, uses)
        elif node.op_type == "MatMul" and node.domain == "":
            found = matmul_transb(node, uses)
        elif node.op_type == "Sigmoid" and node.domain == "":
            found = _silu(node, uses)
        if found is None:
            continue
        kind, new, old = found
        if any(id(o) in replaced for o in old):
            continue
        for o in old:
            replaced[id(o)] = None
        replaced[id(_last(graph, old))] = new
        counts[kind] += 1
    if not replaced and not n_moved and not counts["RotaryHalf"]:
        return "nothing to fuse"
    graph.nodes = [r for r in (replaced.get(id(nd), nd) for nd in graph.nodes) if r is not None]
    counts["SoftmaxAttention"] = fuse_attention(graph)
    graph.opsets.setdefault(DOMAIN, 1)
    parts = [f"{v} {k}" for k, v in counts.items()]
    return ", ".join(parts) + f" ({n_moved} scalings moved before a Transpose)"


def _last(graph: Graph, nodes: list[Node]) -> Node:
    ids = {id(n) for n in nodes}
    return [n for n in graph.nodes if id(n) in ids][-1]


# -- helpers ---------------------------------------------------------------------------------


def _scalar(v: Value | None) -> float | None:
    """The value of a constant with one element, else None."""
    c = None if v is None else v.const
    if c is None or c.size != 1 or c.dtype.kind != "f":
        return None
    return float(c.reshape(()))


def _near(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-6)


def _only(uses: Uses, v: Value | None, op: str) -> Node | None:
    """The single reader of ``v`` when it is an ai.onnx ``op`` node with one output."""
    if v is None:
        return None
    r = uses.only_reader(v)
    if r is None or r.op_type != op or r.domain != "" or len(r.outputs) != 1:
        return None
    return r


def _other(node: Node, v: Value) -> Value | None:
    """The other operand of a binary node one of whose operands is ``v``."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if a is v:
        return b
    return a if b is v else None


# -- GELU ------------------------------------------------------------------------------------


def _gelu(node: Node, uses: Uses) -> tuple[str, Node, list[Node]] | None:
    """node is the Erf or Tanh of a GELU."""
    if node.op_type == "Erf":
        pre = _gelu_erf_input(node)
        approx = "none"
    else:
        pre = _gelu_tanh_input(node, uses)
        approx = "tanh"
    if pre is None:
        return None
    x, inner = pre
    if any(uses.only_reader(n.outputs[0]) is None for n in inner if n.outputs[0] is not None):
        return None
    tail = _gelu_tail(node, x, uses)
    if tail is None:
        return None
    nodes = [*inner, node, *tail]
    out = tail[-1].outputs[0]
    new = Node("Gelu", [x], [out], {"approximate": approx}, name=f"{node.name}/gelu", opset=20)
    return "GELU", new, nodes


def _gelu_erf_input(erf: Node) -> tuple[Value, list[Node]] | None:
    """(x, [the scaling node]) when erf's input is ``x / sqrt 2`` or ``x * (1/sqrt 2)``."""
    u = erf.inputs[0]
    p = None if u is None else u.producer
    if p is None or p.domain != "" or len(p.inputs) != 2:
        return None
    x, c = p.inputs
    by_div = p.op_type == "Div" and _near(_scalar(c), math.sqrt(2.0))
    by_mul = p.op_type == "Mul" and _near(_scalar(c), 1 / math.sqrt(2.0))
    if not (by_div or by_mul):
        if p.op_type != "Mul" or not _near(_scalar(x), 1 / math.sqrt(2.0)):
            return None
        x = c
    if x is None or x.const is not None:
        return None
    return x, [p]


def _gelu_tanh_input(tanh: Node, uses: Uses) -> tuple[Value, list[Node]] | None:
    """(x, inner nodes) when tanh's input is ``sqrt(2/pi) * (x + 0.044715 * x^3)``."""
    u = tanh.inputs[0]
    m1 = None if u is None else u.producer
    if m1 is None or m1.op_type != "Mul" or m1.domain != "" or len(m1.inputs) != 2:
        return None
    k = math.sqrt(2.0 / math.pi)
    a, b = m1.inputs
    s = b if _near(_scalar(a), k) else a if _near(_scalar(b), k) else None
    p_add = None if s is None else s.producer
    if p_add is None or p_add.op_type != "Add" or p_add.domain != "":
        return None
    for x in p_add.inputs:
        c3 = _other(p_add, x) if x is not None else None
        m2 = None if c3 is None else c3.producer
        if m2 is None or m2.op_type != "Mul" or len(m2.inputs) != 2:
            continue
        a2, b2 = m2.inputs
        cube = b2 if _near(_scalar(a2), 0.044715) else a2 if _near(_scalar(b2), 0.044715) else None
        cube_nodes = _cube_of(cube, x) if cube is not None and x is not None else None
        if cube_nodes is not None and x is not None:
            return x, [*cube_nodes, m2, p_add, m1]
    return None


def _cube_of(v: Value, x: Value) -> list[Node] | None:
    """The nodes computing ``v = x^3`` (``Pow(x, 3)`` or ``(x * x) * x`` in any order)."""
    p = v.producer
    if p is None or p.domain != "" or len(p.inputs) != 2:
        return None
    if p.op_type == "Pow" and p.inputs[0] is x and _near(_scalar(p.inputs[1]), 3.0):
        return [p]
    if p.op_type != "Mul":
        return None
    a, b = p.inputs
    sq = b if a is x else a if b is x else None
    q = None if sq is None else sq.producer
    if q is not None and q.op_type == "Mul" and q.inputs[0] is x and q.inputs[1] is x:
        return [q, p]
    return None


def _gelu_tail(act: Node, x: Value, uses: Uses) -> list[Node] | None:
    """The nodes after erf/tanh computing ``x * 0.5 * (t + 1)`` (``t`` = act's output)."""
    t = act.outputs[0]
    add = _only(uses, t, "Add")
    if add is None or not _near(_scalar(_other(add, t)), 1.0):  # type: ignore[arg-type]
        return None
    s = add.outputs[0]
    m1 = _only(uses, s, "Mul")
    if m1 is None or s is None:
        return None
    o1 = _other(m1, s)
    if o1 is x:  # (x * s) * 0.5
        m2 = _only(uses, m1.outputs[0], "Mul")
        if m2 is None or not _near(_scalar(_other(m2, m1.outputs[0])), 0.5):  # type: ignore[arg-type]
            return None
        return [add, m1, m2]
    if _near(_scalar(o1), 0.5):  # (s * 0.5) * x
        m2 = _only(uses, m1.outputs[0], "Mul")
        if m2 is None or _other(m2, m1.outputs[0]) is not x:  # type: ignore[arg-type]
            return None
        return [add, m1, m2]
    h = None if o1 is None else o1.producer  # (x * 0.5) * s
    if h is None or h.op_type != "Mul" or h.domain != "" or o1 is None:
        return None
    if uses.only_reader(o1) is not m1 or _other(h, x) is None:
        return None
    if not _near(_scalar(_other(h, x)), 0.5):
        return None
    return [h, add, m1]


# -- SiLU ------------------------------------------------------------------------------------


def _silu(sig: Node, uses: Uses) -> tuple[str, Node, list[Node]] | None:
    """``Mul(x, Sigmoid(x))`` -> ``Swish(x)`` (opset 24, alpha 1), which ``fuse_linear``
    may fuse into a preceding Linear (``fuse_conv`` has taken the convs' SiLUs already)."""
    x, s = sig.inputs[0] if sig.inputs else None, sig.outputs[0] if sig.outputs else None
    mul = _only(uses, s, "Mul")
    if x is None or mul is None or s is None or _other(mul, s) is not x:
        return None
    dt = getattr(x.type, "dtype", None)
    if dt is None or dt.kind != "f":
        return None
    new = Node("Swish", [x], list(mul.outputs), {"alpha": 1.0}, name=f"{sig.name}/silu", opset=24)
    return "SiLU", new, [sig, mul]


# -- LayerNorm -------------------------------------------------------------------------------


def _mean_last_axis(node: Node) -> bool:
    """ReduceMean over the last axis only, keepdims."""
    if node.op_type != "ReduceMean" or node.domain != "" or not node.attrs.get("keepdims", 1):
        return False
    axes: Any = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        c = node.inputs[1].const
        axes = None if c is None else c.reshape(-1).tolist()
    if axes is None or len(axes) != 1:
        return False
    x = node.inputs[0]
    t = None if x is None else x.type
    rank = getattr(t, "rank", None)
    a = int(axes[0])
    return a == -1 or (rank is not None and a == rank - 1)


def _affine(uses: Uses, y: Value | None, op: str, chain: list[Node]) -> tuple[Any, Any]:
    """(p, op's output) when ``y``'s only reader is ``op`` (Mul: a scale, Add: a shift)
    with a 1-D constant operand ``p`` (appended to ``chain``), else (None, ``y``)."""
    node = _only(uses, y, op)
    if node is None or y is None:
        return None, y
    p = _other(node, y)
    if p is None or p.const is None or p.const.ndim != 1:
        return None, y
    chain.append(node)
    return p, node.outputs[0]


def _norm_size(x: Value, *params: Value | None) -> tuple[int, np.dtype] | None:
    """(normalized size, dtype) of a last-axis norm of float ``x``: x's last dim, else the
    scale's (the Mul broadcasts x's to it); None when unknown, or when a parameter is not
    one value per element of that axis in x's dtype."""
    t = x.type
    dt = getattr(t, "dtype", None)
    shape = getattr(t, "shape", None)
    if dt is None or dt.kind != "f" or not shape:
        return None
    n = shape[-1] if isinstance(shape[-1], int) else None
    if n is None and params[0] is not None:
        n = params[0].const.shape[0]  # type: ignore[union-attr]
    if n is None:
        return None
    for p in params:
        if p is not None and (p.const.shape != (n,) or p.const.dtype != dt):  # type: ignore[union-attr]
            return None
    return n, dt


def _layer_norm(mean: Node, uses: Uses) -> tuple[str, Node, list[Node]] | None:
    """mean is the first ReduceMean of a decomposed LayerNorm."""
    if not _mean_last_axis(mean):
        return None
    x, mu = mean.inputs[0], mean.outputs[0]
    sub = _only(uses, mu, "Sub")
    if x is None or sub is None or sub.inputs[0] is not x or sub.inputs[1] is not mu:
        return None
    d = sub.outputs[0]
    rd = list({id(r): r for r in uses.readers.get(id(d), [])}.values())  # Mul(d, d) once
    if d is None or len(rd) != 2 or uses.is_output(d):
        return None
    sq = next((r for r in rd if r.op_type in ("Pow", "Mul")), None)
    div = next((r for r in rd if r.op_type in ("Div", "Mul") and r is not sq), None)
    if sq is None or div is None or sq.domain != "" or div.domain != "":
        return None
    if sq.op_type == "Pow" and not (sq.inputs[0] is d and _near(_scalar(sq.inputs[1]), 2.0)):
        return None
    if sq.op_type == "Mul" and not (sq.inputs[0] is d and sq.inputs[1] is d):
        return None
    var = _only(uses, sq.outputs[0], "ReduceMean")
    if var is None or not _mean_last_axis(var):
        return None
    add = _only(uses, var.outputs[0], "Add")
    eps = None if add is None else _scalar(_other(add, var.outputs[0]))  # type: ignore[arg-type]
    sqrt = None if add is None else _only(uses, add.outputs[0], "Sqrt")
    if add is None or eps is None or sqrt is None:
        return None
    chain = [mean, sub, sq, var, add, sqrt]
    s = sqrt.outputs[0]
    if div.op_type == "Div":
        if div.inputs[0] is not d or div.inputs[1] is not s or uses.only_reader(s) is not div:  # type: ignore[arg-type]
            return None
    else:  # d * Reciprocal(sqrt)
        rec = _only(uses, s, "Reciprocal")
        if rec is None or _other(div, d) is not rec.outputs[0]:
            return None
        chain.append(rec)
    chain.append(div)
    gamma, y = _affine(uses, div.outputs[0], "Mul", chain)
    beta, y = _affine(uses, y, "Add", chain)
    size = _norm_size(x, gamma, beta)
    if size is None:
        return None
    n, dt = size
    if gamma is None:
        gamma = Value(f"{mean.name}/ln_scale", const=np.ones(n, dt))
    attrs = {"axis": -1, "epsilon": float(eps), "stash_type": 1}
    new = Node(
        "LayerNormalization",
        [x, gamma, beta],
        [y],
        attrs,
        name=f"{mean.name}/layer_norm",
        opset=17,
    )
    return "LayerNorm", new, chain


def _rms_norm(var: Node, uses: Uses) -> tuple[str, Node, list[Node]] | None:
    """var is the ReduceMean of the squares in a decomposed RMS norm."""
    if not _mean_last_axis(var):
        return None
    sq = var.inputs[0]
    if sq is None or sq.producer is None or uses.only_reader(sq) is not var:
        return None
    sq_node = sq.producer
    if sq_node.domain != "":
        return None
    if len(sq_node.outputs) != 1 or not any(nd is sq_node for nd in uses.graph.nodes):
        return None
    x = sq_node.inputs[0]
    if sq_node.op_type == "Pow":
        if not _near(_scalar(sq_node.inputs[1]), 2.0):
            return None
    elif sq_node.op_type != "Mul" or sq_node.inputs[1] is not x:
        return None
    add = _only(uses, var.outputs[0], "Add")
    eps = None if add is None else _scalar(_other(add, var.outputs[0]))  # type: ignore[arg-type]
    sqrt = None if add is None else _only(uses, add.outputs[0], "Sqrt")
    if add is None or eps is None or sqrt is None or x is None:
        return None
    chain = [sq_node, var, add, sqrt]
    s = sqrt.outputs[0]
    head = uses.only_reader(s)  # type: ignore[arg-type]
    if head is None or head.domain != "":
        return None
    if head.op_type == "Div" and head.inputs[0] is x and head.inputs[1] is s:
        chain.append(head)  # x / sqrt
    else:
        if head.op_type == "Reciprocal" or (
            head.op_type == "Div" and head.inputs[1] is s and _near(_scalar(head.inputs[0]), 1.0)
        ):
            r = head.outputs[0]
        else:
            return None
        mul = _only(uses, r, "Mul")
        if mul is None or _other(mul, r) is not x:  # type: ignore[arg-type]
            return None
        chain += [head, mul]
    gamma, y = _affine(uses, chain[-1].outputs[0], "Mul", chain)
    size = _norm_size(x, gamma, None)
    if size is None or size[1] not in (np.float32, np.float64):
        return None
    if any(uses.is_output(c.outputs[0]) for c in chain[:-1]):  # type: ignore[arg-type]
        return None
    n, dt = size
    if gamma is None:
        gamma = Value(f"{var.name}/rms_scale", const=np.ones(n, dt))
    attrs = {"axis": -1, "epsilon": float(eps), "stash_type": 1 if dt == np.float32 else 11}
    new = Node("RMSNormalization", [x, gamma], [y], attrs, name=f"{var.name}/rms_norm", opset=23)
    return "RMSNorm", new, chain


# -- MatMul(A, Transpose(B)) -------------------------------------------------------------------
