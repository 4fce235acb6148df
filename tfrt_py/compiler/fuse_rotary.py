"""Recognize the rotary position embedding Hugging Face's Llama, Mistral, Qwen2 and their
kin apply to queries and keys, as torch.onnx and optimum export it (``rotate_half``):

    x * cos + Concat(Neg(Slice(x, h, end)), Slice(x, 0, h), axis=-1) * sin

(both Slices on the last axis, ``h`` the same value for both -- a constant or the shape
arithmetic ``Shape(x)[-1] / 2`` -- ``end`` past the last element; either operand order of
the Muls and the Add), and replace its seven nodes by one ``tfrt_py.fused::RotaryHalf(x,
cos, sin, h)`` node. Its kernel (``kernels/fused/rotary.py``) computes the same values,
bit for bit, in three NumPy passes instead of seven kernel calls: a decoder applies it
twice per layer on every step.

Every intermediate value must be read inside the pattern only (and not be a graph
output). The replacement takes the Add's output Value and place.
"""

from __future__ import annotations

from ..ir import Graph, Node, Value
from ..kernels.fused.domain import DOMAIN
from .rewrite import Uses

__all__ = ["fuse_rotary"]

#: An ``end`` at least this large is "to the end" whatever the last axis's size.
_TO_END = (1 << 31) - 1


def fuse_rotary(graph: Graph) -> int:
    """Replace every rotate-half rotary embedding in ``graph``; the count replaced."""
    uses = Uses(graph)
    replaced: dict[int, Node | None] = {}
    count = 0
    for node in graph.nodes:
        if node.op_type != "Neg" or node.domain != "" or id(node) in replaced:
            continue
        found = _rotary(node, uses)
        if found is None:
            continue
        new, old = found
        if any(id(o) in replaced for o in old):
            continue
        for o in old:
            replaced[id(o)] = None
        replaced[id(old[-1])] = new
        count += 1
    if count:
        graph.nodes = [r for r in (replaced.get(id(nd), nd) for nd in graph.nodes) if r is not None]
        graph.opsets.setdefault(DOMAIN, 1)
    return count


def _only(uses: Uses, v: Value | None, op: str) -> Node | None:
    """The single reader of ``v`` when it is an ai.onnx ``op`` node with one output."""
    if v is None or uses.is_output(v):
        return None
    r = uses.only_reader(v)
    if r is None or r.op_type != op or r.domain != "" or len(r.outputs) != 1:
        return None
    return r


def _ints(v: Value | None) -> list[int] | None:
    c = None if v is None else v.const
    if c is None or c.dtype.kind not in "iu" or c.ndim > 1:
        return None
    return [int(x) for x in c.reshape(-1)]


def _last_axis_slice(node: Node | None, rank: int) -> tuple[Value, Value | None, Value] | None:
    """(data, starts, ends) of a Slice of one axis, the last, with step 1."""
    if node is None or node.op_type != "Slice" or node.domain != "" or len(node.inputs) < 3:
        return None
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    data, starts, ends, axes, steps = ins[:5]
    if data is None or starts is None or ends is None:
        return None
    got = _ints(axes)
    if got is None or len(got) != 1 or got[0] not in (-1, rank - 1):
        return None
    if steps is not None and _ints(steps) != [1]:
        return None
    return data, starts, ends


def _same_point(a: Value, b: Value) -> bool:
    """Whether two one-element index values are the same point: one Value, or equal
    constants."""
    if a is b:
        return True
    x, y = _ints(a), _ints(b)
    return x is not None and y is not None and len(x) == 1 and x == y


def _rotary(neg: Node, uses: Uses) -> tuple[Node, list[Node]] | None:
    """``neg`` is the Neg of the second half; the fused node and the seven old ones (the
    Add last), or None."""
    if len(neg.inputs) != 1 or len(neg.outputs) != 1:
        return None
    second = neg.inputs[0]
    s2 = None if second is None else second.producer
    cat = _only(uses, neg.outputs[0], "Concat")
    if s2 is None or cat is None or len(cat.inputs) != 2 or cat.inputs[0] is not neg.outputs[0]:
        return None
    if second is None or uses.only_reader(second) is not neg or uses.is_output(second):
        return None
    first = cat.inputs[1]
    s1 = None if first is None else first.producer
    if first is None or s1 is None or uses.only_reader(first) is not cat or uses.is_output(first):
        return None
    x = s2.inputs[0] if s2.inputs else None
    shape = None if x is None else getattr(x.type, "shape", None)
    if x is None or shape is None or len(shape) < 1:
        return None
    rank = len(shape)
    if int(cat.attrs.get("axis", 0)) not in (-1, rank - 1):
        return None
    got1, got2 = _last_axis_slice(s1, rank), _last_axis_slice(s2, rank)
    if got1 is None or got2 is None or got1[0] is not x:
        return None
    _, start1, h = got1
    _, h2, end2 = got2
    if _ints(start1) != [0] or h is None or h2 is None or not _same_point(h, h2):
        return None
    end = _ints(end2)
    d = shape[-1]
    if end is None or len(end) != 1:
        return None
    if not (end[0] >= _TO_END or (isinstance(d, int) and end[0] >= d)):
        return None
    mul_sin = _only(uses, cat.outputs[0], "Mul")
    if mul_sin is None or len(mul_sin.inputs) != 2:
        return None
    sin = mul_sin.inputs[1] if mul_sin.inputs[0] is cat.outputs[0] else mul_sin.inputs[0]
    add = _only(uses, mul_sin.outputs[0], "Add")
    if sin is None or add is None or len(add.inputs) != 2:
        return None
    other = add.inputs[0] if add.inputs[1] is mul_sin.outputs[0] else add.inputs[1]
    mul_cos = None if other is None else other.producer
    if (
        other is None or mul_cos is None or mul_cos.op_type != "Mul" or mul_cos.domain != ""
        or len(mul_cos.inputs) != 2 or uses.only_reader(other) is not add
        or uses.is_output(other) or x not in mul_cos.inputs
    ):  # fmt: skip
        return None
    cos = mul_cos.inputs[1] if mul_cos.inputs[0] is x else mul_cos.inputs[0]
    dt = getattr(x.type, "dtype", None)
    if cos is None or dt is None or dt.kind != "f":
        return None
    new = Node("RotaryHalf", [x, cos, sin, h], list(add.outputs), {}, domain=DOMAIN,
               name=f"{add.name}/rotary", opset=1)  # fmt: skip
    return new, [s1, s2, neg, cat, mul_sin, mul_cos, add]
