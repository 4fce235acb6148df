"""Fuse a quantized SiLU into one table lookup: ``com.microsoft::QLinearMul(x, f(x))`` (or
``QLinearMul(f(x), x)``) where ``f`` is a ``QLinearSigmoid`` or ``QLinearLeakyRelu`` of the
same ``x`` becomes ``tfrt_py.fused::QTable(x, table)``. Every output code is a function of
the input code alone, so the 256 codes are computed at load by the two kernels' own
arithmetic (``kernels.contrib.quantized.unary_times_input_table``): the same codes, one pass
over the tensor instead of two and one node instead of two. EfficientNet's quantized SiLUs
(49 of its 65 Sigmoid/Mul pairs; the squeeze-excitation ones multiply another tensor and
stay).

Only where every scale and zero point of both nodes is a constant and ``f(x)`` has no other
reader. Runs after ``channels_last`` (the pair is elementwise there too). Top-level graph
only; the fused node takes the product's name and output Value.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..ir import Graph, Node, Value
from ..kernels.fused.domain import DOMAIN
from .context import PassContext
from .rewrite import Uses, make_const

__all__ = ["fuse_qtable"]

MS = "com.microsoft"
_UNARY = ("QLinearSigmoid", "QLinearLeakyRelu")


def _consts(node: Node, idx: Iterable[int]) -> list[np.ndarray] | None:
    out = []
    for i in idx:
        v = node.inputs[i] if i < len(node.inputs) else None
        if v is None or v.const is None or v.const.size != 1:
            return None
        out.append(v.const)
    return out


def _pair(mul: Node, uses: Uses) -> tuple[Node, Value, bool] | None:
    """(the unary node, x, whether x is the product's first operand) for a fusable pair."""
    if mul.domain != MS or mul.op_type != "QLinearMul" or len(mul.inputs) < 8:
        return None
    a, b = mul.inputs[0], mul.inputs[3]
    for f_val, x, x_first in ((b, a, True), (a, b, False)):
        if f_val is None or x is None:
            continue
        f = f_val.producer
        if (f is None or f.domain != MS or f.op_type not in _UNARY or not f.inputs
                or f.inputs[0] is not x or uses.only_reader(f_val) is not mul):  # fmt: skip
            continue
        return f, x, x_first
    return None


def fuse_qtable(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    from ..kernels.contrib.quantized import unary_times_input_table  # here: load time only

    uses = Uses(graph)
    gone: set[int] = set()
    made = 0
    for node in list(graph.nodes):
        got = _pair(node, uses)
        if got is None or id(got[0]) in gone:
            continue
        f, x, x_first = got
        unary, mul = _consts(f, range(1, 5)), _consts(node, (1, 2, 4, 5, 6, 7))
        if unary is None or mul is None:
            continue
        alpha = float(f.attrs.get("alpha", 0.01))
        table = unary_times_input_table(f.op_type, alpha, unary, mul, x_first)
        if table is None:
            continue
        t = Value(f"{node.name or 'qtable'}/table")
        make_const(graph, t, table)
        fused = Node("QTable", [x, t], list(node.outputs), name=node.name, domain=DOMAIN,
                     opset=1)  # fmt: skip
        graph.nodes[graph.nodes.index(node)] = fused
        gone.add(id(f))
        made += 1
    if not made:
        return "nothing to fuse"
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    graph.opsets.setdefault(DOMAIN, 1)
    return f"{made} quantized SiLUs (QLinearMul of x and f(x)) to one table lookup each"
