"""Hoist an elementwise op applied to every input of a Concat above the Concat.

``Concat(op(x0, c0), ..., op(xn, cn))`` becomes ``op(Concat(x0..xn), C)`` with ``C`` the
constants ``ci``, broadcast to their inputs' extent along the axis and concatenated at load
(TFRT's "18 scalar normalizations -> one vectorized kernel"). Unary ops hoist the same way
with no constant. Conditions: every Concat input is produced by the same op with the same
attributes, read by the Concat alone; binary ops have their constant operand at the same
position everywhere, and it does not grow its variable operand; sizes along the axis are
static. The Concat's output Value is kept (its name and type do not change).

A pool goes the other way, below its join: ``MaxPool``/``AveragePool`` (one output)
reading alone a ``Concat`` over the channels (axis 1: a pool reads whole planes) becomes
``Concat(Pool(x0), ..., Pool(xn))``, the same values; the pool's output Value is kept.
The join then copies the pooled planes (a quarter of the bytes at stride 2) and each pool
reads a conv's output where it lies. SqueezeNet's two such pools (2-core Intel AVX-512,
batch 1, processes alternating, the rewritten file against the original): 4.89-4.93 ->
4.45-4.52 ms.

A fused conv (``fuse_conv`` runs first) that alone reads a join over the channels, with
one group, constant weights and no residual of its own, reads the join's parts instead: a
conv is a sum over its input channels, so ``Conv(Concat(x0..xn), W)`` is a chain of
convs over ``x_i`` with ``W``'s columns of ``x_i``'s channels, each adding the one before
as its residual, the last with the bias and the activation. Nothing is joined at all (a
join's bytes written and read again); the sums are the same products in another order
(float rounding). The chain writes the output n times and reads it n - 1 times, so a conv
of more filters than (its join's channels) / (n - 1) keeps its join: SqueezeNet's
classifier (512 channels into 1000 filters over 13x13; one Intel AVX-512 process each,
profiled) took 807-837 µs as two convs, 768-797 as the join (38) and one conv.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, TensorType, Value
from ..kernels.fused.domain import DOMAIN
from .context import PassContext
from .rewrite import Uses, attrs_key, op_names, tensor_dtype

__all__ = ["hoist_over_concat"]

_UNARY = frozenset(
    op_names(
        """
        Relu Sigmoid Tanh Exp Log Neg Abs Sqrt Reciprocal Floor Ceil Erf Sign Round
        LeakyRelu Elu Selu Softplus HardSigmoid Not Cast
        """
    )
)
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"})


def hoist_over_concat(graph: Graph, ctx: PassContext) -> str:
    """The pass, repeated while it finds something (a hoisted op's Concat may itself have
    a hoistable op on every input), then the pools pushed below their joins. Returns its
    one-line report."""
    n_hoisted = n_removed = 0
    for _ in range(8):
        hoisted, removed = _hoist_once(graph)
        if not hoisted:
            break
        n_hoisted += hoisted
        n_removed += removed
    n_pools = _pools_below_joins(graph)
    n_convs = _convs_over_parts(graph)
    if not n_hoisted and not n_pools and not n_convs:
        return "nothing to hoist"
    said = []
    if n_hoisted:
        said.append(f"hoisted {n_hoisted} ops over Concat ({n_removed} kernels fewer per call)")
    if n_pools:
        said.append(f"{n_pools} pools pushed below their Concat")
    if n_convs:
        said.append(f"{n_convs} convs over their Concat's parts")
    return "; ".join(said)


#: A conv is split over at most this many parts of its join ...
SPLIT_MAX_PARTS = 4
#: ... each a product over at least this many input channels times taps (a conv of few
#: channels runs below its kernel's pace: many thin parts would cost more than the join).
SPLIT_MIN_K = 64


def _convs_over_parts(graph: Graph) -> int:
    """Each fused conv that alone reads a channel join, as a chain of convs over the join's
    parts (module doc); the number rewritten."""
    uses = Uses(graph)
    names = _names(graph)
    replace: dict[int, list[Node]] = {}
    drop: set[int] = set()
    for conv in graph.nodes:
        got = _split_conv(conv, uses)
        if got is None or id(got[0]) in drop:
            continue
        join, w = got
        out = conv.outputs[0]
        assert out is not None
        chain: list[Node] = []
        prev: Value | None = None
        c0 = 0
        for i, x in enumerate(join.inputs):
            assert x is not None
            c1 = c0 + int(_shape(x)[1])  # type: ignore[index]  # checked static
            last = i == len(join.inputs) - 1
            wv = Value(_fresh(f"{conv.name}/W{i}", names), const=np.ascontiguousarray(w[:, c0:c1]))
            graph.constants.append(wv)
            y = out if last else Value(_fresh(f"{conv.name}/part{i}", names), out.type)
            attrs = dict(conv.attrs, residual=int(prev is not None))
            if not last:
                attrs.update(activation="", alpha=0.0, beta=0.0)
            bias = conv.inputs[2] if last and len(conv.inputs) > 2 else None
            chain.append(Node("Conv", [x, wv, bias, prev], [y], attrs,
                              name=_fresh(f"{conv.name}/over{i}", names), domain=DOMAIN,
                              opset=conv.opset))  # fmt: skip
            prev, c0 = y, c1
        replace[id(conv)] = chain
        drop.add(id(join))
    _splice(graph, replace, drop)
    return len(replace)


def _split_conv(conv: Node, uses: Uses) -> tuple[Node, np.ndarray] | None:
    """(the channel join, the weights) of a fused float conv of one group, constant weights
    and no residual that alone reads a Concat over axis 1 of two to ``SPLIT_MAX_PARTS``
    inputs whose channel counts are known, add up to the weights' input channels and each
    give a product of ``SPLIT_MIN_K`` or more; else None."""
    if conv.domain != DOMAIN or conv.op_type != "Conv" or len(conv.outputs) != 1:
        return None
    ins = conv.inputs
    if len(ins) < 2 or ins[0] is None or ins[1] is None or ins[1].const is None:
        return None
    w = ins[1].const
    if (conv.outputs[0] is None or int(conv.attrs.get("group", 1)) != 1
            or conv.attrs.get("residual", 0) or (len(ins) > 3 and ins[3] is not None)
            or w.ndim < 3 or w.dtype not in (np.float32, np.float64)):  # fmt: skip
        return None
    join = ins[0].producer
    if (join is None or join.op_type != "Concat" or join.domain != "" or len(join.inputs) < 2
            or uses.only_reader(ins[0]) is not conv):  # fmt: skip
        return None
    axis = int(join.attrs.get("axis", 1))
    if (axis + w.ndim if axis < 0 else axis) != 1:
        return None
    channels = []
    for x in join.inputs:
        shape = _shape(x)
        if x is None or shape is None or len(shape) != w.ndim or not isinstance(shape[1], int):
            return None
        channels.append(shape[1])
    taps = int(np.prod(w.shape[2:]))
    if len(channels) > SPLIT_MAX_PARTS or min(channels) * taps < SPLIT_MIN_K:
        return None
    if (len(channels) - 1) * w.shape[0] >= sum(channels):  # the chain's extra output passes
        return None  # would cost more than the join it saves (module doc)
    return (join, w) if sum(channels) == w.shape[1] else None


#: The pools a channel join is pushed below (each reads one plane at a time, any window).
_POOLS = frozenset({"MaxPool", "AveragePool"})


def _pools_below_joins(graph: Graph) -> int:
    """``Pool(Concat(x0..xn, axis=1))`` -> ``Concat(Pool(x0)..Pool(xn))`` in place (module
    doc); the number rewritten."""
    uses = Uses(graph)
    names = _names(graph)
    replace: dict[int, list[Node]] = {}
    drop: set[int] = set()
    for pool in graph.nodes:
        join = _channel_join(pool, uses)
        if join is None or id(join) in drop:
            continue
        out = pool.outputs[0]
        t = out.type if out is not None and isinstance(out.type, TensorType) else None
        parts = []
        for x in join.inputs:
            shape = _shape(x)
            if shape is not None and t is not None and t.shape is not None:
                shape = (*shape[:2], *t.shape[2:])
            else:
                shape = None
            name = _fresh(f"{pool.name}/pooled", names)
            pv = Value(name, TensorType(None if t is None else t.dtype, shape))
            parts.append(Node(pool.op_type, [x], [pv], dict(pool.attrs), name=name,
                              opset=pool.opset))  # fmt: skip
        joined = Node("Concat", [p.outputs[0] for p in parts], [out], dict(join.attrs),
                      name=_fresh(f"{pool.name}/joined", names), opset=join.opset)  # fmt: skip
        replace[id(pool)] = [*parts, joined]
        drop.add(id(join))
    _splice(graph, replace, drop)
    return len(replace)


def _channel_join(pool: Node, uses: Uses) -> Node | None:
    """The Concat over axis 1 of two or more tensors that ``pool`` (a MaxPool or an
    AveragePool with one output and a ``kernel_shape``) alone reads, else None."""
    if pool.op_type not in _POOLS or pool.domain != "" or len(pool.outputs) != 1:
        return None
    x = pool.inputs[0] if pool.inputs else None
    join = None if x is None else x.producer
    if (x is None or pool.outputs[0] is None or join is None or join.op_type != "Concat"
            or join.domain != "" or uses.only_reader(x) is not pool):  # fmt: skip
        return None
    kernel = pool.attrs.get("kernel_shape")
    if not kernel or len(join.inputs) < 2 or any(v is None for v in join.inputs):
        return None
    axis = int(join.attrs.get("axis", 1))
    return join if (axis + len(kernel) + 2 if axis < 0 else axis) == 1 else None


def _hoist_once(graph: Graph) -> tuple[int, int]:
    uses = Uses(graph)
    names = _names(graph)
    replace: dict[int, list[Node]] = {}
    drop: set[int] = set()
    removed = 0
    for node in graph.nodes:
        if node.op_type != "Concat" or node.domain != "" or len(node.inputs) < 2:
            continue
        prods = [_producer(v, node, uses) for v in node.inputs]
        if any(p is None for p in prods):
            continue
        plist = [p for p in prods if p is not None]
        new = _hoist(node, plist, graph, names)
        if new is None:
            continue
        replace[id(node)] = new
        drop.update(id(p) for p in plist)
        removed += len(plist) - 1
    _splice(graph, replace, drop)
    return len(replace), removed


def _producer(v: Value | None, concat: Node, uses: Uses) -> Node | None:
    if v is None or v.producer is None or uses.only_reader(v) is not concat:
        return None
    p = v.producer
    if p.domain != "" or len(p.outputs) != 1:
        return None
    return p


def _hoist(concat: Node, prods: list[Node], graph: Graph, names: set[str]) -> list[Node] | None:
    op = prods[0].op_type
    key = attrs_key(prods[0].attrs)
    if any(p.op_type != op or attrs_key(p.attrs) != key or p.opset != prods[0].opset
           for p in prods):  # fmt: skip
        return None
    xs: list[Value] = []
    const: np.ndarray | None = None
    cpos = -1
    if op in _UNARY:
        if any(len(p.inputs) != 1 or p.inputs[0] is None for p in prods):
            return None
        xs = [p.inputs[0] for p in prods]  # type: ignore[misc]
    elif op in _BINARY:
        got = _binary_operands(concat, prods)
        if got is None:
            return None
        xs, const, cpos = got
    else:
        return None
    dt = tensor_dtype(xs[0])
    if dt is None or any(tensor_dtype(x) != dt for x in xs):
        return None
    out = concat.outputs[0]
    assert out is not None
    mid_name = _fresh(f"{concat.name}/hoisted", names)
    mid_t = out.type if isinstance(out.type, TensorType) else None
    mid = Value(mid_name, TensorType(dt, mid_t.shape if mid_t is not None else None))
    new_concat = Node(
        "Concat", list(xs), [mid], dict(concat.attrs), name=mid_name, opset=concat.opset
    )
    ins: list[Value | None] = [mid]
    if const is not None:
        cv = Value(_fresh(f"{concat.name}/hoisted_const", names), const=const)
        graph.constants.append(cv)
        ins = [cv, mid] if cpos == 0 else [mid, cv]
    p0 = prods[0]
    op_node = Node(op, ins, [out], dict(p0.attrs), name=f"{p0.name}/hoisted", opset=p0.opset)
    return [new_concat, op_node]


def _binary_operands(concat: Node, prods: list[Node]) -> tuple[list[Value], np.ndarray, int] | None:
    """(variable operands, the concatenated constant, the constant's position)."""
    cpos = _const_pos(prods[0])
    if cpos is None or any(_const_pos(p) != cpos for p in prods):
        return None
    xs = [p.inputs[1 - cpos] for p in prods]
    cs = [p.inputs[cpos].const for p in prods]  # type: ignore[union-attr]
    shapes = [_shape(x) for x in xs]
    if any(s is None for s in shapes):
        return None
    rank = len(shapes[0])  # type: ignore[arg-type]
    axis = int(concat.attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or any(len(s) != rank for s in shapes):  # type: ignore[arg-type]
        return None
    parts: list[np.ndarray] = []
    for x_shape, c in zip(shapes, cs):
        assert x_shape is not None and c is not None
        if c.ndim > rank or c.dtype != cs[0].dtype:  # type: ignore[union-attr]
            return None
        c = c.reshape((1,) * (rank - c.ndim) + c.shape)
        if any(cd != 1 and cd != xd for cd, xd in zip(c.shape, x_shape)):
            return None  # the constant would grow its operand
        along = x_shape[axis]
        if not isinstance(along, int):
            return None
        parts.append(np.broadcast_to(c, (*c.shape[:axis], along, *c.shape[axis + 1 :])))
    target = [max(p.shape[d] for p in parts) for d in range(rank)]
    full = []
    for p in parts:
        t = list(target)
        t[axis] = p.shape[axis]
        full.append(np.broadcast_to(p, t))
    return [x for x in xs if x is not None], np.ascontiguousarray(np.concatenate(full, axis)), cpos


def _const_pos(p: Node) -> int | None:
    if len(p.inputs) != 2 or any(v is None for v in p.inputs):
        return None
    a, b = p.inputs
    if b is not None and b.const is not None and (a is None or a.const is None):
        return 1
    if a is not None and a.const is not None and (b is None or b.const is None):
        return 0
    return None


def _shape(v: Value | None) -> tuple[Any, ...] | None:
    t = None if v is None else v.type
    return t.shape if isinstance(t, TensorType) and t.shape is not None else None


def _names(graph: Graph) -> set[str]:
    """Every value name of ``graph`` (``_fresh`` adds to it)."""
    names = {v.name for n in graph.nodes for v in n.outputs if v is not None}
    return names | {v.name for v in graph.inputs} | {c.name for c in graph.constants}


def _splice(graph: Graph, replace: dict[int, list[Node]], drop: set[int]) -> None:
    """``graph.nodes`` with each node in ``replace`` (by id) replaced by its nodes, in its
    place, and the nodes in ``drop`` removed."""
    graph.nodes = [r for n in graph.nodes if id(n) not in drop for r in replace.get(id(n), [n])]


def _fresh(hint: str, names: set[str]) -> str:
    name, i = hint, 0
    while name in names:
        i += 1
        name = f"{hint}_{i}"
    names.add(name)
    return name
