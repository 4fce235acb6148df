"""Fuse a Conv with what follows it into one ``tfrt_py.fused::Conv`` node (kernel in
``kernels/fused/vision.py``): a BatchNormalization folded into the weights, a residual Add, and
an activation, all applied to the conv's output in place while it is in cache.

The group, in order (each part optional, at least one present):

* ``BatchNormalization`` (inference: one output, constant parameters) reading the conv
  output: folded into the weights and bias at load, ``W' = W * a``, ``B' = (B - mean) * a
  + beta`` with ``a = scale / sqrt(var + eps)`` per output channel (computed in float64);
* ``Mul(y, c)`` with ``c`` a constant per output channel (ConvNeXt's layer scale): folded
  into the weights and bias, ``W' = W * c``, ``B' = B * c``;
* ``Add(y, R)`` (either operand order) with ``R`` a computed value of ``y``'s dtype and
  rank whose dims agree with ``y``'s wherever both are known numbers (a model exported with
  dynamic height and width names every conv's output dims afresh: ``unk__7`` and
  ``unk__9`` are one size at run time; the kernel adds an ``R`` of another shape by
  broadcasting), or a constant that broadcasts to one value per channel, which joins the
  bias;
* an activation (``conv_direct.ACTIVATIONS``): Relu, Clip with constant bounds,
  HardSwish, HardSigmoid, Sigmoid, LeakyRelu, Gelu (erf form; the decomposed pattern is
  named by ``fuse_transformer`` after this pass, and ``fuse_vision`` fuses it then), or
  SiLU written as ``Mul(y, Sigmoid(y))``.

Only constant-weight float32/float64 Convs of rank >= 3 fuse, and a group only grows over
a value read by the next node alone and not a graph output. The fused node takes the
place of the group's last node (so a residual computed after the conv is ready) and its
output Value, so names and types are unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, TensorType, Value
from ..kernels.fused.domain import DOMAIN
from ..kernels.lib.activations import ACTIVATIONS
from ..records import record
from .context import PassContext
from .rewrite import Uses

__all__ = ["fuse_conv"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def fuse_conv(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    replaced: dict[int, Node | None] = {}
    consts: list[Value] = []
    n = n_bn = n_mul = n_res = 0
    acts: dict[str, int] = {}
    for node in graph.nodes:
        if id(node) in replaced or not _fusable_conv(node):
            continue
        w = node.inputs[1].const  # type: ignore[union-attr]
        assert w is not None
        bias = _const(node, 2)
        if len(node.inputs) > 2 and node.inputs[2] is not None and bias is None:
            continue  # a computed bias: leave the Conv alone
        group = _grow(node, w, bias, uses, replaced)
        if len(group.nodes) == 1:
            continue
        n_bn += group.bn_folded
        n_mul += group.mul_folded
        n_res += group.residual is not None
        if group.activation is not None:
            acts[group.activation[0]] = acts.get(group.activation[0], 0) + 1
        fused, fused_consts = _fused(node, group)
        consts += fused_consts
        for g in group.nodes:
            replaced[id(g)] = None
        replaced[id(group.nodes[-1])] = fused
        n += 1
    if not n:
        return "nothing to fuse"
    graph.nodes = [r for r in (replaced.get(id(nd), nd) for nd in graph.nodes) if r is not None]
    graph.constants += consts
    graph.opsets.setdefault(DOMAIN, 1)
    act_s = ", ".join(f"{k} x{v}" for k, v in sorted(acts.items())) or "none"
    return (
        f"{n} Conv nodes ({n_bn} BatchNormalization and {n_mul} channel scalings folded, "
        f"{n_res} residual Adds, "
        f"activations: {act_s})"
    )


@record
class _Group:
    """A conv and what follows it, as far as it fuses: its nodes in order, the folded
    weights and bias, the value the group ends at, the residual and the activation."""

    nodes: list[Node]
    w: np.ndarray
    bias: np.ndarray | None
    out: Value
    bn_folded: bool = False
    mul_folded: bool = False
    residual: Value | None = None
    #: (name, alpha, beta)
    activation: tuple[str, float, float] | None = None


def _grow(
    node: Node,
    w: np.ndarray,
    bias: np.ndarray | None,
    uses: Uses,
    replaced: dict[int, Node | None],
) -> _Group:
    """The group of conv ``node`` (weights ``w``, constant ``bias``) over the nodes no
    earlier group took: BatchNormalization, channel Mul, Add, activation, each optional."""
    group = _Group([node], w, bias, _must_out(node))
    nxt = _free(uses.only_reader(group.out), replaced)
    folded = _fold_bn(nxt, group.w, group.bias) if nxt is not None else None
    if folded is not None and nxt is not None and _out(nxt) is not None:
        group.w, group.bias = folded
        group.out = _must_out(nxt)
        group.nodes.append(nxt)
        group.bn_folded = True
    nxt = _free(uses.only_reader(group.out), replaced)
    scaled = _fold_channel_mul(nxt, group.out, group.w, group.bias) if nxt is not None else None
    if scaled is not None and nxt is not None:
        group.w, group.bias = scaled
        group.out = _must_out(nxt)
        group.nodes.append(nxt)
        group.mul_folded = True
    nxt = _free(uses.only_reader(group.out), replaced)
    if (
        nxt is not None
        and nxt.op_type == "Add"
        and nxt.domain == ""
        and len(nxt.inputs) == 2
        and _out(nxt) is not None
    ):
        _add_residual_or_bias(group, nxt)
    act = _activation(uses, group.out)
    if act is not None and not any(id(a) in replaced for a in act[3]):
        name, alpha, beta, act_nodes = act
        group.out = _must_out(act_nodes[-1])
        group.nodes += act_nodes
        group.activation = (name, alpha, beta)
    return group


def _add_residual_or_bias(group: _Group, add: Node) -> None:
    """Take ``add`` (a two-input Add reading the group's output) into the group: its other
    operand joins the bias (one constant per channel) or is the residual (a computed value
    of the output's type); else leave it out."""
    w, out = group.w, group.out
    other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    cb = _channel_const(other, w.shape[0], w.ndim, w.dtype)
    if cb is not None:
        group.bias = cb if group.bias is None else (group.bias + cb).astype(w.dtype)
    elif other is not None and _residual_fits(other, out) and other is not out:
        group.residual = other
    if cb is not None or group.residual is not None:
        group.out = _must_out(add)
        group.nodes.append(add)


def _fused(node: Node, group: _Group) -> tuple[Node, list[Value]]:
    """The ``tfrt_py.fused::Conv`` node replacing ``group`` (conv ``node`` first), and the
    new constants it reads."""
    wv = Value(f"{node.name}/W", const=np.ascontiguousarray(group.w))
    bv = None if group.bias is None else Value(f"{node.name}/B", const=group.bias)
    name, alpha, beta = group.activation or ("", 0.0, 0.0)
    attrs: dict[str, Any] = {k: v for k, v in node.attrs.items() if k in _CONV_ATTRS}
    attrs.update(activation=name, alpha=alpha, beta=beta, residual=int(group.residual is not None))
    fused = Node(
        "Conv",
        [node.inputs[0], wv, bv, group.residual],
        [group.out],
        attrs,
        name=f"{node.name}/fused",
        domain=DOMAIN,
        opset=1,
    )
    return fused, [v for v in (wv, bv) if v is not None]


def _out(node: Node) -> Value | None:
    """The node's single output, or None when it has several or none."""
    return node.outputs[0] if len(node.outputs) == 1 else None


def _must_out(node: Node) -> Value:
    """The single output of a node already checked to have one."""
    v = _out(node)
    assert v is not None
    return v


def _free(node: Node | None, replaced: dict[int, Node | None]) -> Node | None:
    """``node`` unless an earlier group took it (two convs feeding one residual Add)."""
    return None if node is None or id(node) in replaced else node


def _fusable_conv(node: Node) -> bool:
    if node.op_type != "Conv" or node.domain != "" or len(node.inputs) < 2:
        return False
    if len(node.outputs) != 1 or node.outputs[0] is None or node.inputs[0] is None:
        return False
    w = node.inputs[1].const if node.inputs[1] is not None else None
    if w is None or w.ndim < 3 or w.dtype not in _FLOATS:
        return False
    t = node.inputs[0].type
    return isinstance(t, TensorType) and t.dtype == w.dtype


def _const(node: Node, i: int) -> np.ndarray | None:
    v = node.inputs[i] if len(node.inputs) > i else None
    return None if v is None else v.const


def _ttype(v: Value | None) -> TensorType | None:
    t = None if v is None else v.type
    return t if isinstance(t, TensorType) and t.shape is not None else None


def _residual_fits(r: Value, y: Value) -> bool:
    """Whether ``r`` may be the residual of the conv output ``y``: same dtype and rank, the
    dims equal wherever both are numbers (symbols and unknowns are checked at run time)."""
    tr, ty = _ttype(r), _ttype(y)
    if tr is None or ty is None or tr.dtype != ty.dtype or tr.shape is None or ty.shape is None:
        return False
    if len(tr.shape) != len(ty.shape):
        return False
    return all(
        a == b for a, b in zip(tr.shape, ty.shape) if isinstance(a, int) and isinstance(b, int)
    )


def _fold_bn(
    bn: Node, w: np.ndarray, bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """(W', B') with an inference BatchNormalization folded in, else None."""
    if bn.op_type != "BatchNormalization" or bn.domain != "" or bn.opset < 9:
        return None
    if len(bn.outputs) != 1 or len(bn.inputs) != 5 or bn.attrs.get("training_mode", 0):
        return None
    ps = [v.const if v is not None else None for v in bn.inputs[1:]]
    if any(p is None or p.shape != (w.shape[0],) for p in ps):
        return None
    s, b, m, v = (np.asarray(p, np.float64) for p in ps)
    a = s / np.sqrt(v + float(bn.attrs.get("epsilon", 1e-5)))
    if not np.all(np.isfinite(a)):
        return None
    w2 = (w.astype(np.float64) * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    b0 = np.zeros(w.shape[0]) if bias is None else bias.astype(np.float64)
    return w2, ((b0 - m) * a + b).astype(w.dtype)


def _fold_channel_mul(
    mul: Node, y: Value, w: np.ndarray, bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(W * c, B * c) when ``mul`` is ``Mul(y, c)`` with ``c`` one constant per output
    channel (ConvNeXt's layer scale), else None."""
    if mul.op_type != "Mul" or mul.domain != "" or _out(mul) is None:
        return None
    c = _channel_const(_other_input(mul, y), w.shape[0], w.ndim, w.dtype)
    if c is None or not np.all(np.isfinite(c)):
        return None
    w2 = (w * c.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    return w2, None if bias is None else (bias * c).astype(w.dtype)


def _other_input(node: Node, v: Value) -> Value | None:
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    return b if a is v else a if b is v else None


def _channel_const(v: Value | None, m: int, rank: int, dt: np.dtype) -> np.ndarray | None:
    """A constant Add operand holding one value per output channel (it broadcasts to the
    conv output (N, M, ...) of rank ``rank`` without growing it, every axis but the
    channel axis of size 1), as an (M,) array; else None."""
    c = None if v is None else v.const
    if c is None or c.dtype != dt or c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + tuple(c.shape)
    if shape[1] not in (1, m) or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return np.ascontiguousarray(
        np.broadcast_to(c.reshape(-1), (m,)) if c.size == 1 else c.reshape(m)
    )


def _activation(uses: Uses, y: Value) -> tuple[str, float, float, list[Node]] | None:
    """(name, alpha, beta, nodes) of an activation reading ``y`` alone, else None."""
    rs = uses.readers.get(id(y), [])
    if uses.is_output(y):
        return None
    if len(rs) == 2 and {r.op_type for r in rs} == {"Sigmoid", "Mul"}:
        sig = next(r for r in rs if r.op_type == "Sigmoid")
        mul = next(r for r in rs if r.op_type == "Mul")
        s_out = sig.outputs[0]
        if (
            sig.domain == mul.domain == ""
            and s_out is not None
            and uses.only_reader(s_out) is mul
            and {id(v) for v in mul.inputs} == {id(y), id(s_out)}
            and len(mul.inputs) == 2
        ):
            return "SiLU", 0.0, 0.0, [sig, mul]
        return None
    node = uses.only_reader(y)
    if node is None or node.domain != "" or node.inputs[0] is not y:
        return None
    if len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    op = node.op_type
    if op not in ACTIVATIONS or op == "SiLU":
        return None
    a = node.attrs
    if op == "Clip":
        lo, hi = _clip_bounds(node)
        if lo is None:
            return None
        return op, lo, hi, [node]  # type: ignore[return-value]
    if len(node.inputs) != 1:
        return None
    if op == "HardSigmoid":
        return op, float(a.get("alpha", 0.2)), float(a.get("beta", 0.5)), [node]
    if op == "LeakyRelu":
        return op, float(a.get("alpha", 0.01)), 0.0, [node]
    if op == "Gelu" and a.get("approximate", "none") != "none":
        return None  # the epilogue computes the erf form only
    return op, 0.0, 0.0, [node]


def _clip_bounds(node: Node) -> tuple[float | None, float | None]:
    """Clip's (min, max) as floats (infinite when absent), or (None, None) when a bound is
    computed or min > max (ONNX then gives max everywhere: not worth a case)."""
    if node.opset < 11:
        lo = float(node.attrs.get("min", -np.inf))
        hi = float(node.attrs.get("max", np.inf))
    else:
        vals: list[float] = []
        for i, default in ((1, -np.inf), (2, np.inf)):
            v = node.inputs[i] if len(node.inputs) > i else None
            if v is None:
                vals.append(default)
            elif v.const is None or v.const.size != 1:
                return None, None
            else:
                vals.append(float(v.const.reshape(())))
        lo, hi = vals
    if lo > hi or np.isnan(lo) or np.isnan(hi):
        return None, None
    return lo, hi
