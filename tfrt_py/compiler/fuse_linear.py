"""Fuse MatMul/Gemm with a constant weight, a following bias Add and an activation into
one ``tfrt_py.fused::Linear`` node (kernel in ``kernels/fused/linear.py``).

Inference-only: weights are constants, so Gemm's ``transB`` and ``alpha`` fold into the
weight and ``beta`` into the bias at load, as do a constant scaling of the input
(``_fold_scale``) and a one-element constant scaling of the output reached through ops
that only move elements (``_fold_output_scale``: the sqrt(scale) scaled dot-product
attention's exports put on Q and K after the head split). A group fuses only when each
intermediate value is read by the next node alone (and is not a graph output); the fused
node keeps the last node's output Value, so names and types are unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, Value
from ..kernels.fused.domain import DOMAIN, Step
from .context import PassContext, flags_lookup
from .rewrite import Uses, op_names, tensor_dtype

__all__ = ["ACTIVATIONS", "fuse_linear"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: Activations a Linear may end with (run by their own ONNX kernels, in place).
ACTIVATIONS = frozenset(
    op_names(
        """
        Relu Sigmoid Tanh LeakyRelu HardSigmoid Elu Selu Softplus HardSwish Gelu Clip Swish
        """
    )
)


def fuse_linear(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    flags_of = flags_lookup(ctx)
    consts: list[Value] = []
    replaced: dict[int, Node | None] = {}  # id(old node) -> fused node at its place, or None
    n_bias = n_act = n_scale = n_out_scale = n = 0
    for node in graph.nodes:
        if id(node) in replaced:
            continue
        head = _weights(node)
        if head is None:
            continue
        x, w, bias = head
        group = [node]
        scaled = _fold_scale(x, w, node, uses)
        if scaled is not None:
            x, w, scale_node = scaled
            replaced[id(scale_node)] = None
            n_scale += 1
        out = node.outputs[0]
        assert out is not None
        if bias is None and node.op_type == "MatMul":
            nxt = uses.only_reader(out)
            b = _bias_of(nxt, out, w, x) if nxt is not None else None
            if nxt is not None and b is not None:
                bias, out = b, nxt.outputs[0]
                group.append(nxt)
        steps: list[Step] = []
        extras: list[Value | None] = []
        nxt = uses.only_reader(out)  # type: ignore[arg-type]
        act = None
        if nxt is not None and _in_place_ok(flags_of(nxt)):
            act = _activation(nxt, out, len(extras) + 3)  # type: ignore[arg-type]
        if act is not None and nxt is not None:
            step, act_extras = act
            steps.append(step)
            extras += act_extras
            out = nxt.outputs[0]
            group.append(nxt)
        post = None if steps else _fold_output_scale(out, w, uses)  # type: ignore[arg-type]
        if post is not None:
            c, mul, writer = post
            w = (w * c).astype(w.dtype)
            bias = None if bias is None else (bias * c).astype(bias.dtype)
            out = _drop_scaling(mul, writer, out)  # type: ignore[arg-type]
            replaced[id(mul)] = None
            n_out_scale += 1
        wv = Value(f"{node.name}/W", const=w)
        bv = None if bias is None else Value(f"{node.name}/bias", const=bias)
        consts += [c for c in (wv, bv) if c is not None]
        fused = Node(
            "Linear",
            [x, wv, bv, *extras],
            [out],
            {"activation": steps},
            name=f"{node.name}/fused",
            domain=DOMAIN,
            opset=1,
        )
        replaced[id(node)] = fused
        for g in group[1:]:
            replaced[id(g)] = None
        n += 1
        n_bias += bias is not None
        n_act += bool(steps)
    if not n:
        return "nothing to fuse"
    graph.nodes = [r for r in (replaced.get(id(nd), nd) for nd in graph.nodes) if r is not None]
    graph.constants += consts
    graph.opsets.setdefault(DOMAIN, 1)
    return (
        f"{n} Linear nodes ({n_bias} with bias, {n_act} with activation, "
        f"{n_scale} input scalings and {n_out_scale} output scalings folded into the weights)"
    )


def _weights(node: Node) -> tuple[Value, np.ndarray, np.ndarray | None] | None:
    """(x, W [K,N], bias or None) for a MatMul/Gemm this pass can fuse, else None."""
    if node.domain != "" or len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    x, wv = node.inputs[0], node.inputs[1]
    if x is None or wv is None or wv.const is None or wv.const.ndim != 2:
        return None
    w = wv.const
    if w.dtype not in _FLOATS or tensor_dtype(x) != w.dtype:
        return None
    if node.op_type == "MatMul":
        return x, w, None
    a = node.attrs
    if a.get("transA", 0) or node.opset < 7:
        return None  # opsets < 7 carry a broadcast attribute; not worth the cases
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    # Keep the layout the model stores W in (a transposed view for transB=1; NumPy keeps it
    # through the scaling): each output is then the same BLAS dot product onnxruntime
    # computes. A re-layout changes per-column rounding, which softmax over huge logits
    # turns into visibly different outputs (the classic light CNNs).
    w = w.T if a.get("transB", 0) else w
    w = (w * alpha).astype(w.dtype) if alpha != 1.0 else w
    cv = node.inputs[2] if len(node.inputs) > 2 else None
    if cv is None or beta == 0.0:
        return x, w, None
    c = cv.const
    if c is None or c.dtype != w.dtype or c.ndim > 2:
        return None
    if c.ndim >= 1 and c.shape[-1] not in (1, w.shape[1]):
        return None
    if c.ndim == 2 and c.shape[0] != 1:
        rows = x.type.shape[0] if x.type is not None and x.type.shape else None  # type: ignore[union-attr]
        if c.shape[0] != rows:
            return None
    return x, w, ((c * beta).astype(c.dtype) if beta != 1.0 else c)


def _fold_scale(
    x: Value, w: np.ndarray, node: Node, uses: Uses
) -> tuple[Value, np.ndarray, Node] | None:
    """When ``x = Mul(v, c)`` or ``Div(v, c)`` with ``c`` a constant scaling x's last axis
    and ``x`` read by ``node`` alone: (v, W scaled by c along its rows, the Mul/Div node).
    ``(v / c) @ W == v @ (W / c[:, None])``; finite, nonzero ``c`` only, so no inf or NaN
    moves from one side to the other."""
    p = x.producer
    if p is None or p.domain != "" or p.op_type not in ("Mul", "Div") or len(p.inputs) != 2:
        return None
    if uses.only_reader(x) is not node:
        return None
    a, b = p.inputs
    if b is not None and b.const is not None and a is not None and a.const is None:
        v, c = a, b.const
    elif p.op_type == "Mul" and a is not None and a.const is not None and b is not None:
        v, c = b, a.const
    else:
        return None
    k = w.shape[0]
    if c.dtype != w.dtype or c.size not in (1, k) or any(d != 1 for d in c.shape[:-1]):
        return None
    if c.ndim > 1 and (v.type is None or len(getattr(v.type, "shape", None) or ()) < c.ndim):
        return None  # c would add leading dims to v
    if tensor_dtype(v) != w.dtype or not np.all(np.isfinite(c)) or not np.all(c != 0):
        return None
    col = np.broadcast_to(c.reshape(-1), (k,))[:, None]
    scaled = (w / col) if p.op_type == "Div" else (w * col)
    return v, scaled.astype(w.dtype), p


#: Ops that only move or relabel elements: a one-element scaling after them may be done
#: before them.
_LAYOUT = frozenset(op_names("Reshape Transpose Squeeze Unsqueeze Flatten Identity"))


def _fold_output_scale(y: Value, w: np.ndarray, uses: Uses) -> tuple[Any, Node, Node | None] | None:
    """When the Linear's output ``y`` reaches ``Mul(t, c)`` through ops that only move
    elements (``_LAYOUT``; scaled dot-product attention's exports scale Q and K by
    sqrt(scale) after the head split: Reshape, Transpose, Mul), each value read by the next
    node alone and none a graph output, with ``c`` one constant element of W's dtype, 0 <
    |c| <= 1, that adds no axes: (c as a scalar, the Mul, the last layout node or None when
    the Mul reads ``y`` itself). ``(x @ W + b) * c == x @ (W c) + b c`` to rounding; with
    |c| <= 1 no partial sum of the scaled product can overflow where the original's did
    not (a larger c could turn a finite output near float32's max into inf)."""
    v, writer = y, None
    for _ in range(8):  # a short chain: nothing real has more
        nxt = uses.only_reader(v)
        if nxt is None or nxt.domain != "" or len(nxt.outputs) != 1 or nxt.outputs[0] is None:
            return None
        if nxt.op_type in _LAYOUT:
            if nxt.inputs[0] is not v:
                return None
            v, writer = nxt.outputs[0], nxt
            continue
        if nxt.op_type != "Mul" or len(nxt.inputs) != 2:
            return None
        other = nxt.inputs[1] if nxt.inputs[0] is v else nxt.inputs[0]
        if other is None or other.const is None or other.const.size != 1:
            return None
        c = other.const
        rank = len(getattr(v.type, "shape", None) or ()) if v.type is not None else None
        if c.dtype != w.dtype or tensor_dtype(v) != w.dtype or rank is None or c.ndim > rank:
            return None
        scale = float(c.reshape(()).item())
        if not 0.0 < abs(scale) <= 1.0:  # also no NaN: |c| > 1 could overflow W c or x W c
            return None
        return scale, nxt, writer
    return None


def _drop_scaling(mul: Node, writer: Node | None, y: Value) -> Value:
    """Take ``mul`` (scaling the layout chain's result) out: the chain's last node, or the
    Linear when ``writer`` is None, writes the Mul's output Value (its name and consumers
    kept). Returns the Value the Linear writes."""
    out = mul.outputs[0]
    assert out is not None
    if writer is None:
        return out
    writer.outputs = [out]
    out.producer = writer
    return y


def _bias_of(add: Node, y: Value, w: np.ndarray, x: Value) -> np.ndarray | None:
    """The constant operand of ``add`` (reading ``y`` = x @ W) when it is a bias that
    broadcasts to the output without growing it, else None."""
    if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if other is None or other.const is None or other.const.dtype != w.dtype:
        return None
    b = other.const
    n = w.shape[1]
    if b.ndim >= 1 and b.shape[-1] not in (1, n):
        return None
    if any(d != 1 for d in b.shape[:-1]):
        return None
    rank = len(x.type.shape) if x.type is not None and x.type.shape is not None else None  # type: ignore[union-attr]
    if b.ndim > 1 and (rank is None or b.ndim > rank):
        return None
    return b


def _in_place_ok(flags: Any) -> bool:
    """The activation runs as ``act(y, out=y)``: its kernel must allow that."""
    return flags is not None and flags.inplace and flags.supports_out


def _activation(node: Node, acc: Value, first_extra: int) -> tuple[Step, list[Value | None]] | None:
    """A step running ``node`` (an activation reading ``acc``) in place, plus the extra
    constant inputs it reads (numbered from ``first_extra``), else None."""
    if node.domain != "" or node.op_type not in ACTIVATIONS or node.inputs[0] is not acc:
        return None
    if len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    extras = list(node.inputs[1:])
    if any(v is not None and v.const is None for v in extras):
        return None
    refs = (-1, *range(first_extra, first_extra + len(extras)))
    return (node.op_type, node.opset, dict(node.attrs), refs), extras
