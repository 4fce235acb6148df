"""Shape arithmetic folded per input signature (the native tier's signature mode).

An export computes Reshape targets, mask shapes and position ranges from its feeds'
shapes: Shape and Size, then Gather, Unsqueeze, Concat, Range, Equal, Where... on those
and on constants. For one input signature all of it is constant: ``shape_arithmetic``
finds those nodes (from the graph alone: ``lower.blockers`` does not count them), and
``shape_values`` takes their values from the signature's zero-feed probe, which
``lower`` packs as constants so the nodes emit no code. Pure functions; run at load.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import Graph, Node

__all__ = ["SHAPE_VALUE_MAX", "shape_arithmetic", "shape_values"]

#: Values computed from shapes alone (``shape_values``) are baked in as constants up to
#: this many elements each.
SHAPE_VALUE_MAX = 1 << 16
#: Ops whose output is not a function of their inputs' values.
_RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
     "Bernoulli"}
)  # fmt: skip


def shape_arithmetic(graph: Graph) -> list[Node]:
    """The nodes whose outputs depend on the feeds' shapes but not on their values: Shape
    and Size, and every node computing from those and constants alone (the Gather,
    Unsqueeze, Concat, Equal, Where, Range... of an export's shape arithmetic). Nodes
    with subgraphs and random ops excluded."""
    known: set[int] = set()
    found = []
    for node in graph.nodes:
        if node.op_type in _RANDOM_OPS or list(node.subgraphs()):
            continue
        ins = [v for v in node.inputs if v is not None]
        if not ins:
            continue
        shape_op = node.domain == "" and node.op_type in ("Shape", "Size")
        if not shape_op and not all(v.const is not None or id(v) in known for v in ins):
            continue
        known.update(id(v) for v in node.outputs if v is not None)
        found.append(node)
    return found


def shape_values(graph: Graph, values: dict[int, Any]) -> dict[int, np.ndarray]:
    """``shape_arithmetic``'s outputs as the probe computed them: for one input signature
    they are constants. At most ``SHAPE_VALUE_MAX`` elements each (a bigger one stays a
    node to lower)."""
    out: dict[int, np.ndarray] = {}
    for node in shape_arithmetic(graph):
        for v in node.outputs:
            x = None if v is None else values.get(id(v))
            if v is not None and isinstance(x, np.ndarray) and x.size <= SHAPE_VALUE_MAX:
                out[id(v)] = x
    return out
