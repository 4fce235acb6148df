"""Fuse the products ``onnxruntime.quantization.quantize_dynamic`` writes into one
``com.microsoft::MatMulIntegerToFloat`` each, as onnxruntime's MatMulIntegerToFloatFusion
does (``onnxruntime/core/optimizer/matmul_integer_to_float.cc``).

The tool writes, per MatMul of a float activation by a weight::

    DynamicQuantizeLinear(x) -> (xq, x_scale, x_zp)          (shared by the products of x)
    Mul(x_scale, w_scale) -> multiplier
    MatMulInteger(xq, wq, x_zp, w_zp) -> Cast(to=float) -> Mul(., multiplier)
        [-> Add(., bias)]

The group from MatMulInteger to the Mul (and an Add of a constant bias of N float32
values, when the Mul's output is read by nothing else) becomes
``MatMulIntegerToFloat(xq, wq, x_scale, w_scale, x_zp, w_zp, bias)`` writing the last
node's output Value. The values are the same bits: the kernel multiplies the int32 sums,
converted to float32, by ``x_scale * w_scale`` (float32, that order) and adds the bias, as
the nodes did. Required: the weight a constant 2-D uint8/int8 matrix; its scale a constant
of one value or one per column; ``x_scale`` one value (a DynamicQuantizeLinear's scale or a
constant) and ``x_zp`` absent, a DynamicQuantizeLinear's or one constant value; each
intermediate read only by the next node and not a graph output. Anything else stays as
written and the report says why. The multiplier's Mul stays for other readers, else
``dce`` removes it. Only the top-level graph; the rewrite is graph data.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir import Graph, Node, Value
from .context import PassContext
from .rewrite import Uses

__all__ = ["fuse_dynamic_quant"]

MS = "com.microsoft"
_FLOAT = 1  # ONNX TensorProto.FLOAT


class _Refused(Exception):
    """The group stays as written; the message is the reason the report gives."""


def _onnx(node: Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain == ""


def _next(uses: Uses, v: Value | None, op: str) -> Node:
    """The one node reading ``v``, of type ``op``; _Refused otherwise."""
    if v is None or uses.is_output(v):
        raise _Refused(f"its {op} input is a graph output")
    r = uses.only_reader(v)
    if not _onnx(r, op):
        raise _Refused(f"not followed by {op} alone")
    return r  # type: ignore[return-value]


def _one_value(v: Value | None, what: str) -> None:
    """``v`` is a DynamicQuantizeLinear's scale/zero point or a one-value constant."""
    if v is None:
        return
    if v.const is not None:
        if np.asarray(v.const).size != 1:
            raise _Refused(f"{what} not one value")
        return
    if not _onnx(v.producer, "DynamicQuantizeLinear"):
        raise _Refused(f"{what} not from DynamicQuantizeLinear")


def _group(node: Node, uses: Uses) -> tuple[Node, list[Node]]:
    ins = node.inputs
    a, b = ins[0], ins[1]
    a_zp = ins[2] if len(ins) > 2 else None
    b_zp = ins[3] if len(ins) > 3 else None
    if a is None or b is None or b.const is None:
        raise _Refused("weight not constant")
    w = np.asarray(b.const)
    if w.ndim != 2 or w.dtype not in (np.uint8, np.int8):
        raise _Refused("weight not a 2-D 8-bit matrix")
    n = w.shape[1]
    if b_zp is not None and (b_zp.const is None or np.asarray(b_zp.const).size not in (1, n)):
        raise _Refused("weight zero point not constant per tensor or column")
    _one_value(a_zp, "activation zero point")
    cast = _next(uses, node.outputs[0], "Cast")
    if int(cast.attrs.get("to", 0)) != _FLOAT:
        raise _Refused("Cast not to float32")
    mul = _next(uses, cast.outputs[0], "Mul")
    f = cast.outputs[0]
    multiplier = mul.inputs[1] if mul.inputs[0] is f else mul.inputs[0]
    scales = multiplier.producer if multiplier is not None else None
    if not _onnx(scales, "Mul") or multiplier is None or uses.is_output(multiplier):
        raise _Refused("scale not a product of two scales")
    s0, s1 = scales.inputs  # type: ignore[union-attr]
    a_scale, b_scale = (s0, s1) if s1 is not None and s1.const is not None else (s1, s0)
    if b_scale is None or b_scale.const is None:
        raise _Refused("weight scale not constant")
    bs = np.asarray(b_scale.const)
    if bs.dtype != np.float32 or bs.size not in (1, n) or (bs.ndim > 1 and bs.size > 1):
        raise _Refused("weight scale not float32 per tensor or column")
    _one_value(a_scale, "activation scale")
    taken = [cast, mul]
    out = mul.outputs[0]
    bias: Value | None = None
    add = None if out is None or uses.is_output(out) else uses.only_reader(out)
    if _onnx(add, "Add"):
        other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]  # type: ignore[union-attr]
        c = None if other is None else other.const
        if c is not None and c.dtype == np.float32 and c.shape == (n,):
            bias, out = other, add.outputs[0]  # type: ignore[union-attr]
            taken.append(add)  # type: ignore[arg-type]
    new = Node("MatMulIntegerToFloat", [a, b, a_scale, b_scale, a_zp, b_zp, bias], [out], {},
               name=f"{node.name}/to_float" if node.name else "", domain=MS, opset=1)  # fmt: skip
    return new, taken


def fuse_dynamic_quant(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    if not any(_onnx(n, "MatMulInteger") for n in graph.nodes):
        return "nothing to fuse"
    uses = Uses(graph)
    gone: dict[int, Node | None] = {}
    left: Counter[str] = Counter()
    biased = 0
    for node in graph.nodes:
        if not _onnx(node, "MatMulInteger"):
            continue
        try:
            new, taken = _group(node, uses)
        except _Refused as why:
            left[str(why)] += 1
            continue
        gone[id(node)] = new
        for t in taken:
            gone[id(t)] = None
        biased += len(taken) == 3
    if gone:
        graph.nodes = [r for r in (gone.get(id(n), n) for n in graph.nodes) if r is not None]
        graph.opsets.setdefault(MS, 1)
    done = sum(r is not None for r in gone.values())
    said = f"{done} MatMulInteger group{'s' * (done != 1)} to MatMulIntegerToFloat"
    said += f" ({biased} with their bias)" if done else ""
    if left:
        said += "; left: " + ", ".join(f"{k} x{v}" for k, v in left.most_common())
    return said
