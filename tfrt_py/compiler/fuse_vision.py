"""Vision patterns that only show once ``fuse_transformer`` has named them (it runs before
this pass): each becomes one node of the private domain (kernels in ``kernels/fused/vision.py``).

* **channel LayerNorm** -- ``Transpose(perm [0, 2, ..., r-1, 1])`` (channels last) ->
  ``LayerNormalization`` over the last axis with constant 1-D scale (and bias) ->
  ``Transpose`` back (``[0, r-1, 1, ..., r-2]``), ConvNeXt's LayerNorm2d: one
  ``tfrt_py.fused::ChannelLayerNorm(X, scale, bias?)`` normalizing over axis 1 of the
  channels-first tensor (``kernels/nn/norm_channel.py``), no transposes;
* **squeeze-and-excite** -- ``GlobalAveragePool(x)`` (or ``ReduceMean`` over the plane,
  dims kept: the dynamo exporter's) -> fused 1x1 ``Conv`` (+ activation)
  -> fused 1x1 ``Conv`` (+ gate activation) -> ``Mul`` with ``x`` (MobileNet v3,
  EfficientNet, RegNetY): one ``tfrt_py.fused::SqueezeExcite(x, W1, B1, W2, B2)`` -- the
  mean, two small products, their epilogues and the scaling in one kernel instead of four
  nodes of a few µs of work and ~10 µs of dispatch each;
* **GroupNorm** -- torch's opset-17 export of ``nn.GroupNorm``: ``Reshape(x, [0, G, -1])``
  -> ``InstanceNormalization`` with unit scale and zero bias -> ``Reshape`` to ``Shape(x)``
  -> ``Mul`` and ``Add`` by constant per-channel (C, 1, ...) tensors (-> ``Relu``): one
  ``tfrt_py.fused::GroupNorm(x, gamma, beta)`` (RetinaNet's and FCOS's heads);
* **BatchNormalization + activation** -- an inference ``BatchNormalization`` (constant
  parameters, one output) of a float32 tensor of rank 3 or more that no conv before it
  took (``fuse_conv`` runs first: pre-activation networks, DenseNet's ``Concat ->
  BatchNormalization -> Relu -> Conv``), and the activation reading it alone if any: one
  ``tfrt_py.fused::BatchNormAct(x, a, s)`` with the statistics folded to a per-channel
  scale and shift as the BatchNormalization kernel folds them (float64, then float32),
  one pass (``kernels/nn/norm_affine.py``);
* **a product's BatchNorm1d** -- ``MatMul(x, W)`` with a constant 2-D ``W``, then (when
  its output has more than two dims) ``Flatten`` to (rows, features), then an inference
  ``BatchNormalization`` over those features (timm's LinearNorm: LeViT's 47; the
  product may be read by Shape nodes besides, which its fold does not change): the
  statistics folded into ``W``'s columns and an ``Add`` of the shift after the product
  (in float64, then float32, as ``fuse_conv`` folds a conv's), which ``fuse_linear`` then
  takes as the product's bias: no pass over the output at all;
* **Conv + GELU** -- an erf ``Gelu`` (ONNX opset 20, ``approximate`` none, as
  ``fuse_transformer`` writes it) reading a constant-weight float Conv, or a fused Conv
  with no activation yet: the Conv takes it as its epilogue's activation (``Gelu``:
  applied to each block of the output while it is in cache, ``conv_blocked``).

Intermediate values must be read inside their pattern only and not be graph outputs. The
replacement takes the pattern's last node's output Value and place, so names and types
are unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, TensorType, Value
from ..kernels.fused.domain import DOMAIN
from .context import PassContext
from .fuse_conv import _CONV_ATTRS, _activation, _fusable_conv
from .rewrite import Uses

__all__ = ["fuse_vision"]


def fuse_vision(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    replaced: dict[int, Any] = {}
    n_ln = n_gelu = n_se = n_gn = n_bn = n_fold = 0
    consts: list[Value] = []
    for node in graph.nodes:
        if id(node) in replaced or node.domain != "":
            continue
        found: tuple[Node, list[Node]] | None = None
        if node.op_type == "LayerNormalization":
            found = _channel_layer_norm(node, uses)
            n_ln += found is not None
        elif node.op_type == "Gelu":
            found = _conv_gelu(node, uses)
            n_gelu += found is not None
        elif node.op_type == "Mul":
            found = _squeeze_excite(node, uses, replaced)
            n_se += found is not None
        elif node.op_type == "InstanceNormalization":
            found = _group_norm(node, uses)
            n_gn += found is not None
        elif node.op_type == "BatchNormalization":
            folded = _product_batch_norm(node, uses, replaced, consts)
            if folded is not None:
                n_fold += 1
                for o in folded[1]:
                    replaced[id(o)] = None
                replaced[id(folded[1][-1])] = folded[0]
                continue
            found = _batch_norm_act(node, uses, replaced, consts)
            n_bn += found is not None
        if found is None:
            continue
        new, old = found
        for o in old:
            replaced[id(o)] = None
        replaced[id(old[-1])] = new
    if not replaced:
        return "nothing to fuse"
    nodes: list[Node] = []
    for nd in graph.nodes:
        r = replaced.get(id(nd), nd)
        nodes += r if isinstance(r, list) else [] if r is None else [r]
    graph.nodes = nodes
    graph.constants += consts
    graph.opsets.setdefault(DOMAIN, 1)
    return (f"{n_ln} channel LayerNorms, {n_gelu} Conv+GELU, {n_se} squeeze-and-excite, "
            f"{n_gn} GroupNorms, {n_bn} BatchNormalization+activation, "
            f"{n_fold} BatchNormalization folded into a product")  # fmt: skip


def _bn_fold(bn: Node, c: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) in float64 of an inference BatchNormalization (opset 9+, one output)
    with constant (C,) parameters -- ``c`` of them where given -- else None: ``y = x *
    scale + shift`` per channel, as the BatchNormalization kernel folds them."""
    if bn.domain != "" or bn.opset < 9 or len(bn.inputs) != 5 or _single_out(bn) is None:
        return None
    if int(bn.attrs.get("training_mode", 0)):
        return None
    params = [v.const if v is not None else None for v in bn.inputs[1:5]]
    first = params[0]
    if first is None or first.ndim != 1 or (c is not None and first.shape != (c,)):
        return None
    if any(p is None or p.shape != first.shape for p in params):
        return None
    sc, b, m, v = (np.asarray(p, dtype=np.float64) for p in params)
    with np.errstate(divide="ignore", invalid="ignore"):  # inf/NaN: the callers decide
        a = sc / np.sqrt(v + float(bn.attrs.get("epsilon", 1e-5)))
        return a, b - m * a


def _read_by(uses: Uses, y: Value, node: Node) -> bool:
    """Whether ``node`` reads ``y`` once and every other reader is a Shape (LeViT's
    ``reshape_as``: the folded product's values change, its shape does not)."""
    rs = uses.readers.get(id(y), [])
    return (
        not uses.is_output(y)
        and sum(1 for r in rs if r is node) == 1
        and sum(1 for v in node.inputs if v is y) == 1
        and all(r is node or (r.op_type == "Shape" and r.domain == "") for r in rs)
    )


def _product_batch_norm(
    bn: Node, uses: Uses, replaced: dict[int, Any], consts: list[Value]
) -> tuple[list[Node], list[Node]] | None:
    """([MatMul', Add(, Flatten)], [MatMul(, Flatten), BatchNormalization]) with the
    statistics folded into the product's weights, or None (module doc)."""
    x = bn.inputs[0] if bn.inputs else None
    src = None if x is None else x.producer
    flat = src if src is not None and src.op_type == "Flatten" and src.domain == "" else None
    mm = flat.inputs[0].producer if flat is not None and flat.inputs[0] is not None else src
    if mm is None or mm.op_type != "MatMul" or mm.domain != "" or len(mm.inputs) != 2:
        return None
    y, w = _single_out(mm), mm.inputs[1].const if mm.inputs[1] is not None else None
    t = None if y is None else y.type
    if y is None or w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    if not isinstance(t, TensorType) or t.shape is None or t.dtype != np.float32:
        return None
    rank = len(t.shape)
    if flat is None and rank != 2:
        return None
    if flat is not None:
        axis = int(flat.attrs.get("axis", 1))
        fo = _single_out(flat)
        if (axis + rank if axis < 0 else axis) != rank - 1 or fo is None:
            return None
        if not _read_by(uses, y, flat) or uses.only_reader(fo) is not bn:
            return None
    elif not _read_by(uses, y, bn):
        return None
    if any(id(n) in replaced for n in (mm, flat) if n is not None):
        return None
    fold = _bn_fold(bn, w.shape[1])
    if fold is None or not np.all(np.isfinite(fold[0])):  # as fuse_conv folds a conv's
        return None
    a, sh = fold
    wv = Value(f"{mm.name}/W_bn", const=(w.astype(np.float64) * a).astype(np.float32))
    sv = Value(f"{bn.name}/shift", const=sh.astype(np.float32))
    consts += [wv, sv]
    out = _single_out(bn)
    summed = Value(f"{bn.name}/shifted", type=t) if flat is not None else out
    new = [Node("MatMul", [mm.inputs[0], wv], [y], name=mm.name, opset=mm.opset),
           Node("Add", [y, sv], [summed], name=f"{bn.name}/shift", opset=14)]  # fmt: skip
    if flat is not None:
        new.append(Node("Flatten", [summed], [out], dict(flat.attrs), name=flat.name,
                        opset=flat.opset))  # fmt: skip
    old = [n for n in (mm, flat, bn) if n is not None]
    return new, old


def _batch_norm_act(
    bn: Node, uses: Uses, replaced: dict[int, Any], consts: list[Value]
) -> tuple[Node, list[Node]] | None:
    """(BatchNormAct, [BatchNormalization(, activation nodes)]) or None; the folded scale
    and shift join ``consts``."""
    y, x = _single_out(bn), bn.inputs[0] if bn.inputs else None
    t = None if x is None else x.type
    if y is None or x is None or not isinstance(t, TensorType) or t.dtype != np.float32:
        return None
    fold = _bn_fold(bn) if t.shape is not None and len(t.shape) >= 3 else None
    if fold is None:
        return None
    av = Value(f"{bn.name}/scale", const=fold[0].astype(np.float32))
    sv = Value(f"{bn.name}/shift", const=fold[1].astype(np.float32))
    old, out, attrs = [bn], y, {"activation": "", "alpha": 0.0, "beta": 0.0}
    act = _activation(uses, y)
    if act is not None and not any(id(n) in replaced for n in act[3]):
        name, alpha, beta, act_nodes = act
        last = _single_out(act_nodes[-1])
        if last is not None:
            attrs = {"activation": name, "alpha": alpha, "beta": beta}
            old, out = [bn, *act_nodes], last
    consts += [av, sv]
    fused = Node("BatchNormAct", [x, av, sv], [out], attrs, name=f"{bn.name}/act",
                 domain=DOMAIN, opset=1)  # fmt: skip
    return fused, old


def _single_out(node: Node | None) -> Value | None:
    if node is None or len(node.outputs) != 1:
        return None
    return node.outputs[0]


def _perm(node: Node | None) -> list[int] | None:
    if node is None or node.op_type != "Transpose" or node.domain != "":
        return None
    p = node.attrs.get("perm")
    return None if p is None else [int(i) for i in p]


def _channel_layer_norm(ln: Node, uses: Uses) -> tuple[Node, list[Node]] | None:
    """(ChannelLayerNorm, [Transpose, LayerNormalization, Transpose]) or None."""
    if len(ln.inputs) < 2 or ln.inputs[0] is None or ln.inputs[1] is None:
        return None
    if len(ln.outputs) != 1 or ln.outputs[0] is None:  # Mean / InvStdDev wanted
        return None
    x_t = ln.inputs[0]
    t1 = x_t.producer
    r = len(_perm(t1) or [])
    if t1 is None or r < 3 or _perm(t1) != [0, *range(2, r), 1] or t1.inputs[0] is None:
        return None
    if uses.only_reader(x_t) is not ln or int(ln.attrs.get("axis", -1)) not in (-1, r - 1):
        return None
    y_t = ln.outputs[0]
    t2 = uses.only_reader(y_t)
    if _perm(t2) != [0, r - 1, *range(1, r - 1)] or t2 is None or _single_out(t2) is None:
        return None
    scale = ln.inputs[1].const
    bias_v = ln.inputs[2] if len(ln.inputs) > 2 else None
    bias = None if bias_v is None else bias_v.const
    if scale is None or scale.ndim != 1 or (bias_v is not None and bias is None):
        return None
    if bias is not None and bias.shape != scale.shape:
        return None
    if int(ln.attrs.get("stash_type", 1)) != 1 or scale.dtype.kind != "f":
        return None
    attrs: dict[str, Any] = {"epsilon": float(ln.attrs.get("epsilon", 1e-5))}
    new = Node(
        "ChannelLayerNorm",
        [t1.inputs[0], ln.inputs[1], bias_v],
        [t2.outputs[0]],
        attrs,
        name=f"{ln.name}/channels",
        domain=DOMAIN,
        opset=1,
    )
    return new, [t1, ln, t2]


def _conv_gelu(gelu: Node, uses: Uses) -> tuple[Node, list[Node]] | None:
    """(the Conv with a GELU epilogue, [Conv, Gelu]) or None."""
    if gelu.attrs.get("approximate", "none") != "none" or len(gelu.inputs) != 1:
        return None
    y = gelu.inputs[0]
    out = _single_out(gelu)
    conv = None if y is None else y.producer
    if conv is None or out is None or uses.only_reader(y) is not gelu:  # type: ignore[arg-type]
        return None
    if _fusable_conv(conv):
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        if bias is not None and bias.const is None:
            return None
        attrs: dict[str, Any] = {k: v for k, v in conv.attrs.items() if k in _CONV_ATTRS}
        attrs.update(activation="Gelu", alpha=0.0, beta=0.0, residual=0)
        ins = [conv.inputs[0], conv.inputs[1], bias, None]
    elif (
        conv.op_type == "Conv" and conv.domain == DOMAIN and not conv.attrs.get("activation")
        and _is_float(conv.inputs[1])
    ):  # fmt: skip
        attrs = dict(conv.attrs, activation="Gelu", alpha=0.0, beta=0.0)
        ins = list(conv.inputs)
    else:
        return None
    new = Node("Conv", ins, [out], attrs, name=f"{conv.name}/gelu", domain=DOMAIN, opset=1)
    return new, [conv, gelu]


def _is_float(v: Value | None) -> bool:
    c = None if v is None else v.const
    return c is not None and c.dtype in (np.dtype(np.float32), np.dtype(np.float64))


def _se_conv(node: Node | None) -> dict[str, Any] | None:
    """The epilogue attributes of a fused, constant-weight, 2-D 1x1 Conv with no residual
    and default geometry, or None."""
    if node is None or node.op_type != "Conv" or node.domain != DOMAIN or len(node.inputs) < 2:
        return None
    w = node.inputs[1].const if node.inputs[1] is not None else None
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if w is None or w.ndim != 4 or w.shape[2:] != (1, 1) or not _is_float(node.inputs[1]):
        return None
    if (bias is not None and bias.const is None) or any(node.inputs[3:]):
        return None
    a = node.attrs
    if int(a.get("group", 1)) != 1 or int(a.get("residual", 0)):
        return None
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    for key in ("strides", "dilations"):
        if any(int(v) != 1 for v in a.get(key, ())):
            return None
    if any(int(v) != 0 for v in a.get("pads", ())):
        return None
    return {"activation": str(a.get("activation", "")), "alpha": float(a.get("alpha", 0.0)),
            "beta": float(a.get("beta", 0.0))}  # fmt: skip


def _squeeze_excite(
    mul: Node, uses: Uses, replaced: dict[int, Node | None]
) -> tuple[Node, list[Node]] | None:
    """(SqueezeExcite, [GlobalAveragePool or its ReduceMean, Conv, Conv, Mul]) or None."""
    if mul.domain != "" or len(mul.inputs) != 2 or _single_out(mul) is None:
        return None
    for x, s in (mul.inputs, mul.inputs[::-1]):
        conv2 = None if s is None else s.producer
        h = None if conv2 is None or not conv2.inputs else conv2.inputs[0]
        conv1 = None if h is None else h.producer
        g = None if conv1 is None or not conv1.inputs else conv1.inputs[0]
        gap = None if g is None else g.producer
        if x is None or gap is None or not _spatial_mean(gap):
            continue
        if gap.inputs[0] is not x or any(id(n) in replaced for n in (gap, conv1, conv2)):
            continue
        e1, e2 = _se_conv(conv1), _se_conv(conv2)
        if e1 is None or e2 is None or conv1 is None or conv2 is None:
            continue
        if (uses.only_reader(g) is not conv1 or uses.only_reader(h) is not conv2  # type: ignore[arg-type]
                or uses.only_reader(s) is not mul):  # type: ignore[arg-type]  # fmt: skip
            continue
        w1, w2 = conv1.inputs[1].const, conv2.inputs[1].const  # type: ignore[union-attr]
        if (
            w1 is None
            or w2 is None
            or w1.dtype != w2.dtype
            or w2.shape[0] != w1.shape[1]
            or w2.shape[1] != w1.shape[0]
        ):
            continue
        attrs = {f"{k}{i}": v for i, e in ((1, e1), (2, e2)) for k, v in e.items()}
        b1 = conv1.inputs[2] if len(conv1.inputs) > 2 else None
        b2 = conv2.inputs[2] if len(conv2.inputs) > 2 else None
        new = Node(
            "SqueezeExcite",
            [x, conv1.inputs[1], b1, conv2.inputs[1], b2],
            [mul.outputs[0]],
            attrs,
            name=f"{mul.name}/squeeze_excite",
            domain=DOMAIN,
            opset=1,
        )
        return new, [gap, conv1, conv2, mul]
    return None


def _spatial_mean(node: Node) -> bool:
    """Whether ``node`` is a 4-D tensor's mean over its plane with the dims kept:
    ``GlobalAveragePool``, or ``ReduceMean`` over axes {2, 3} (negative counted from the
    end; an attribute, or from opset 18 a constant input) with ``keepdims`` (the dynamo
    exporter's squeeze-and-excite writes that one)."""
    if node.domain != "" or not node.inputs or node.inputs[0] is None:
        return False
    if node.op_type == "GlobalAveragePool":
        return True
    if node.op_type != "ReduceMean" or not int(node.attrs.get("keepdims", 1)):
        return False
    t = node.inputs[0].type
    if not isinstance(t, TensorType) or t.rank != 4:
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = node.inputs[1].const
    if axes is None:
        return False
    flat = [int(a) for a in np.asarray(axes).reshape(-1)]
    return len(flat) == 2 and {a % 4 for a in flat} == {2, 3}


def _const_of(node: Node | None, op: str, x: Value) -> Value | None:
    """The constant other input of the binary ``op`` node that reads ``x``, or None."""
    if node is None or node.op_type != op or node.domain != "" or len(node.inputs) != 2:
        return None
    other = node.inputs[1] if node.inputs[0] is x else node.inputs[0]
    return None if other is None or other is x or other.const is None else other


def _shape_of(to: Value | None, x: Value, uses: Uses) -> list[Node] | None:
    """When ``to`` is ``Shape(x)`` or the constant of x's static shape (folded): the nodes
    to drop with the pattern (the Shape node when nothing else reads it); else None."""
    sh = None if to is None else to.producer
    if sh is not None:
        if sh.op_type != "Shape" or sh.domain != "" or sh.inputs[0] is not x or sh.attrs:
            return None
        return [sh] if to is not None and uses.only_reader(to) is not None else []
    t = x.type
    if to is None or to.const is None or not isinstance(t, TensorType) or not t.is_static:
        return None
    return [] if [int(d) for d in to.const.reshape(-1)] == list(t.shape or ()) else None


def _unit_affine(inn: Node) -> bool:
    """Whether the InstanceNormalization's scale is all ones and its bias all zeros."""
    scale, bias = (v.const if v is not None else None for v in inn.inputs[1:3])
    if scale is None or bias is None or scale.dtype.kind != "f":
        return False
    return bool(np.all(scale == 1) and not np.any(bias))


def _group_norm(inn: Node, uses: Uses) -> tuple[Node, list[Node]] | None:
    """(GroupNorm, [Reshape, InstanceNormalization, Reshape, Mul, Add(, Relu)]) or None."""
    xs = inn.inputs[0] if len(inn.inputs) == 3 else None
    r1 = None if xs is None else xs.producer
    if xs is None or r1 is None or r1.op_type != "Reshape" or not _unit_affine(inn):
        return None
    shape = r1.inputs[1].const if r1.inputs[1] is not None else None
    if shape is None or shape.shape != (3,) or shape[0] != 0 or shape[2] != -1 or shape[1] < 1:
        return None
    x, y = r1.inputs[0], _single_out(inn)
    r2 = None if y is None else uses.only_reader(y)
    if x is None or r2 is None or r2.op_type != "Reshape" or uses.only_reader(xs) is not inn:
        return None
    z = _single_out(r2)
    shape_nodes = _shape_of(r2.inputs[1], x, uses)
    if z is None or shape_nodes is None:
        return None
    mul = uses.only_reader(z)
    gamma = _const_of(mul, "Mul", z)
    zm = _single_out(mul)
    add = None if zm is None else uses.only_reader(zm)
    beta = None if zm is None else _const_of(add, "Add", zm)
    if mul is None or add is None or gamma is None or beta is None:
        return None
    g, b = gamma.const, beta.const
    if g is None or b is None or g.shape != b.shape or g.ndim < 2 or g.dtype.kind != "f":
        return None
    if any(d != 1 for d in g.shape[1:]):
        return None
    old = [*shape_nodes, r1, inn, r2, mul, add]
    last = _single_out(add)
    relu = None if last is None else uses.only_reader(last)
    if last is not None and relu is not None and relu.op_type == "Relu" and relu.domain == "":
        old.append(relu)
        last = _single_out(relu)
    if last is None:
        return None
    attrs = {"groups": int(shape[1]), "epsilon": float(inn.attrs.get("epsilon", 1e-5)),
             "activation": "Relu" if old[-1] is relu else ""}  # fmt: skip
    name = f"{inn.name}/group_norm"
    return Node(
        "GroupNorm", [x, gamma, beta], [last], attrs, name=name, domain=DOMAIN, opset=1
    ), old
