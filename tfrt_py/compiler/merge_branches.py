"""Merge parallel conv branches over one input into one conv: a sum of convs of the
same input -- a KxK, a 1x1, an inference BatchNormalization of the input itself or the
input itself -- is one KxK conv whose weights are the branches' weights summed, each
smaller kernel at the centre of the larger (RepVGG's "structural re-parameterization").

RepVGG, MobileOne and ACNet-style blocks are trained as branches and, exported without
their deploy-time merge (timm's ``repvgg_a0`` as ``torch.onnx`` writes it in eval mode),
run each branch as its own conv over the same input and add the outputs: a 3x3, a 1x1
and a BatchNormalization pass, then two Adds. Convolution is linear in its weights, so
``conv(x, W3) + conv(x, W1) + bn(x) == conv(x, W3 + pad(W1) + diag(a)) + (b3 + b1 +
shift)`` exactly in real arithmetic; in float32 the merged sum rounds differently (the
outputs agree to float32 rounding of the summed products). onnxruntime runs the branches
as they are written.

What merges: the leaves of a tree of two-input ``Add`` nodes (each inner sum read by the
next Add alone, no graph output) when every leaf reads one value ``x`` and is

* a ``Conv`` of ``x`` with constant float weights and a constant (or no) bias, read by
  the tree alone, or such a Conv followed by an inference ``BatchNormalization`` (folded
  in float64 first, as ``fuse_conv`` folds one);
* an inference ``BatchNormalization`` of ``x`` read by the tree alone (constant finite
  statistics), or ``x`` itself: the identity, as a 1x1 conv of one tap per channel;

and the convs agree on group, strides, dilations (1) and filter count, each kernel fits
centred in the largest (even size differences) with its pads the largest's less the
margin on each side, and an identity leaf sees a stride-1 "same" conv of as many filters
as ``x`` has channels. The merged Conv takes the largest conv's attributes and the root
Add's output Value (names and types unchanged); ``fuse_conv`` runs after this pass and
takes its activation. Weights are summed in float64, then cast to the weights' dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, TensorType, Value
from .context import PassContext
from .fuse_conv import _fold_bn, _fusable_conv
from .fuse_vision import _bn_fold
from .rewrite import Uses

__all__ = ["merge_conv_branches"]


class _Branch:
    """One leaf: its weights (M, C/group, kh, kw) and bias (M,) in float64 (a
    BatchNormalization identity: its scale and shift), the conv whose geometry it has
    (None: a 1x1 stride-1 tap, the identity), the value it reads and the nodes it
    removes."""

    __slots__ = ("bias", "conv", "nodes", "reads", "w")

    def __init__(self, w: np.ndarray, bias: np.ndarray, conv: Node | None, nodes: list[Node],
                 reads: Value | None) -> None:  # fmt: skip
        self.w, self.bias, self.conv, self.nodes, self.reads = w, bias, conv, nodes, reads


def merge_conv_branches(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    gone: set[int] = set()
    made: dict[int, Node] = {}  # id(root Add) -> the merged Conv
    consts: list[Value] = []
    n = leaves = 0
    for node in reversed(graph.nodes):  # roots first: an inner Add is taken with its root
        if id(node) in gone or not _is_add(node):
            continue
        adds, terms = _tree(node, uses)
        if len(terms) < 2:
            continue
        merged = _merge(terms, uses)
        if merged is None:
            continue
        conv, branches = merged
        new, new_consts = _merged_conv(conv, branches, node)
        consts += new_consts
        for a in adds:
            gone.add(id(a))
        for b in branches:
            gone.update(id(x) for x in b.nodes)
        made[id(node)] = new
        n += 1
        leaves += len(branches)
    if not n:
        return "nothing to merge"
    nodes = []
    for nd in graph.nodes:
        if id(nd) in made:
            nodes.append(made[id(nd)])
        elif id(nd) not in gone:
            nodes.append(nd)
    graph.nodes = nodes
    graph.constants += consts
    return f"{n} sums of {leaves} conv branches merged into one conv each"


def _is_add(node: Node) -> bool:
    return (
        node.op_type == "Add"
        and node.domain == ""
        and len(node.inputs) == 2
        and len(node.outputs) == 1
        and all(v is not None for v in node.inputs)
    )


def _tree(root: Node, uses: Uses) -> tuple[list[Node], list[Value]]:
    """The Adds of the sum ``root`` ends (inner ones read by the next alone) and its
    leaves' values."""
    adds, terms = [root], []
    stack = list(root.inputs)
    while stack:
        v = stack.pop()
        assert v is not None
        p = v.producer
        if p is not None and _is_add(p) and uses.only_reader(v) is not None:
            adds.append(p)
            stack += p.inputs
        else:
            terms.append(v)
    return adds, terms


def _merge(terms: list[Value], uses: Uses) -> tuple[Node, list[_Branch]] | None:
    """(the largest conv, every leaf as a branch) when the leaves merge (module doc)."""
    leaves = [_leaf(v, uses) for v in terms]
    convs = [b for b in leaves if b is not None and b.conv is not None]
    if not convs or any(b is None for b in leaves):
        return None
    x = convs[0].conv.inputs[0]  # type: ignore[union-attr]
    branches: list[_Branch] = [b for b in leaves if b is not None]
    if x is None:
        return None
    if any(b.reads is not x for b in branches):
        return None
    big = max(convs, key=lambda b: b.w.shape[2] * b.w.shape[3])
    assert big.conv is not None
    geo = _geometry(big.conv)
    if geo is None or any(b.w.ndim != 4 for b in convs):
        return None
    group, strides, pads = geo
    kh, kw = big.w.shape[2:]
    m = big.w.shape[0]
    for b in branches:
        if b.conv is None:  # the identity: a 1x1 tap of stride 1, as many filters as x
            ok = strides == (1, 1) and _channels(x) == m and (not b.nodes or b.w.shape == (m,))
            ok = ok and m % group == 0 and _fits(1, 1, (0, 0, 0, 0), kh, kw, pads)
        else:
            g = _geometry(b.conv)
            ok = g is not None and g[0] == group and g[1] == strides and b.w.shape[0] == m
            ok = ok and g is not None and _fits(b.w.shape[2], b.w.shape[3], g[2], kh, kw, pads)
            ok = ok and b.w.shape[1] == big.w.shape[1] and _wtype(b.conv) == _wtype(big.conv)
        if not ok:
            return None
    return big.conv, branches


def _wtype(conv: Node) -> np.dtype:
    w = conv.inputs[1].const  # type: ignore[union-attr]
    assert w is not None
    return w.dtype


def _leaf(v: Value, uses: Uses) -> _Branch | None:
    """``v`` as a branch: a Conv (and its BatchNormalization), a BatchNormalization of the
    input, or the input itself (the identity, whose weights are made in ``_merged_conv``
    once the group is known); None where it is none of these."""
    p = v.producer
    identity = _Branch(np.zeros(0), np.zeros(0), None, [], v)  # if the others read v
    if p is None:  # a graph input, or a constant (not an identity)
        return None if v.const is not None else identity
    single = uses.only_reader(v) is not None
    if p.op_type == "Conv" and _fusable_conv(p) and single:
        return _conv_leaf(p, [p])
    if p.op_type == "BatchNormalization" and p.domain == "" and single:
        src = p.inputs[0] if p.inputs else None
        q = src.producer if src is not None else None
        if (
            q is not None and q.op_type == "Conv" and _fusable_conv(q)
            and uses.only_reader(src) is p  # type: ignore[arg-type]
        ):  # fmt: skip
            w = q.inputs[1].const  # type: ignore[union-attr]
            assert w is not None
            folded = _fold_bn(p, w.astype(np.float64), _bias(q))
            if folded is None:
                return None
            return _Branch(folded[0], folded[1], q, [q, p], q.inputs[0])
        fold = _bn_fold(p)
        if fold is None or not all(np.all(np.isfinite(a)) for a in fold):
            return None
        return _Branch(fold[0], fold[1], None, [p], src)
    return identity


def _conv_leaf(conv: Node, nodes: list[Node]) -> _Branch | None:
    w = conv.inputs[1].const  # type: ignore[union-attr]
    assert w is not None  # _fusable_conv's
    if len(conv.inputs) > 2 and conv.inputs[2] is not None and _bias(conv) is None:
        return None  # a computed bias
    b = _bias(conv)
    m = w.shape[0]
    return _Branch(
        w.astype(np.float64), np.zeros(m) if b is None else b, conv, nodes, conv.inputs[0]
    )


def _bias(conv: Node) -> np.ndarray | None:
    v = conv.inputs[2] if len(conv.inputs) > 2 else None
    c = None if v is None else v.const
    return None if c is None else np.asarray(c, np.float64).reshape(-1)


def _geometry(conv: Node) -> tuple[int, tuple[int, int], tuple[int, ...]] | None:
    """(group, strides, pads) of a 2-D conv with explicit non-negative pads and no
    dilation, else None (a negative pad, which the Conv kernel refuses, is not merged
    into a conv that would take it)."""
    a = conv.attrs
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return None
    if any(int(d) != 1 for d in a.get("dilations", [1, 1])):
        return None
    strides = tuple(int(s) for s in a.get("strides", [1, 1]))
    pads = tuple(int(p) for p in a.get("pads", [0, 0, 0, 0]))
    if len(strides) != 2 or len(pads) != 4 or min(pads) < 0:
        return None
    return int(a.get("group", 1)), (strides[0], strides[1]), pads


def _fits(h: int, w: int, pads: tuple[int, ...], kh: int, kw: int, big: tuple[int, ...]) -> bool:
    """Whether an ``h`` x ``w`` kernel with ``pads`` reads, for every output, the centre
    taps of a ``kh`` x ``kw`` kernel with pads ``big``."""
    if (kh - h) % 2 or (kw - w) % 2 or h > kh or w > kw:
        return False
    mh, mw = (kh - h) // 2, (kw - w) // 2
    return pads == (big[0] - mh, big[1] - mw, big[2] - mh, big[3] - mw)


def _channels(x: Value) -> int | None:
    t = x.type
    if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != 4:
        return None
    c = t.shape[1]
    return c if isinstance(c, int) else None


def _merged_conv(conv: Node, branches: list[_Branch], root: Node) -> tuple[Node, list[Value]]:
    """The one Conv for ``branches`` (``conv`` the largest), writing ``root``'s output."""
    w0 = conv.inputs[1].const  # type: ignore[union-attr]
    assert w0 is not None
    m, cg, kh, kw = w0.shape
    w = np.zeros((m, cg, kh, kw))
    bias = np.zeros(m)
    x = conv.inputs[0]
    for b in branches:
        if b.conv is None:
            scale = np.ones(m) if not b.nodes else b.w
            o = np.arange(m)
            w[o, o % cg, kh // 2, kw // 2] += scale
            if b.nodes:
                bias += b.bias
            continue
        h, wd = b.w.shape[2:]
        top, left = (kh - h) // 2, (kw - wd) // 2
        w[:, :, top : top + h, left : left + wd] += b.w
        bias += b.bias
    dtype = w0.dtype
    wv = Value(f"{conv.name}/merged/W", const=w.astype(dtype))
    bv = Value(f"{conv.name}/merged/B", const=bias.astype(dtype))
    attrs: dict[str, Any] = dict(conv.attrs)
    new = Node("Conv", [x, wv, bv], [root.outputs[0]], attrs, name=f"{conv.name}/merged",
               opset=conv.opset)  # fmt: skip
    return new, [wv, bv]
