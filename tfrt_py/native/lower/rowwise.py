"""Whether a graph treats the rows of its batch dimension independently (row mode).

A model whose inputs have a dynamic first dim (the batch) can run natively for every batch
size at once when each output row depends only on the same row of the inputs: the tier
then lowers the graph for one row and loops over the rows (``lower(rows=True)``). This
module decides that from the op types, their attributes, and the shapes of two zero-feed
probes (batch 1 and batch 2): every value computed from a batched value must be batched
itself (first dim 1 then 2, the other dims equal), and its op must not mix rows (no
reduction, softmax, concat, slice or transpose over axis 0, weights that are not data of
the row, ...). Anything not known to be row-wise declines, and the tier specializes per
input signature instead. The first native call is also checked against the interpreter
(``tier``), a second line of defence.

Load time; pure functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import Graph
from .registry import lowerings
from .source import Declined

__all__ = ["check_rows"]

Shapes = dict[int, tuple[tuple[int, ...], np.dtype]]


def _is_batched(s1: tuple[int, ...] | None, s2: tuple[int, ...] | None) -> bool:
    return (
        s1 is not None and s2 is not None and len(s1) == len(s2) >= 1
        and s1[0] == 1 and s2[0] == 2 and s1[1:] == s2[1:]
    )  # fmt: skip


def check_rows(graph: Graph, s1: Shapes, s2: Shapes, batched_inputs: list[bool]) -> None:
    """Declined unless every output row of ``graph`` depends only on the same row of the
    batched inputs (``s1``/``s2``: value shapes at batch 1 and 2)."""
    batched = {id(v) for v, b in zip(graph.inputs, batched_inputs) if b}
    for node in graph.nodes:
        flags = [v is not None and id(v) in batched for v in node.inputs]
        outs = [o for o in node.outputs if o is not None]
        if not any(flags):
            if any(_shape(s1, o) != _shape(s2, o) for o in outs):
                raise Declined([f"rows: {node.op_type} node {node.name!r} changes with the batch"])
            continue
        record = lowerings().get(node.domain, node.op_type)
        rule = None if record is None else record.rows
        first = node.inputs[0]
        rank = len(_shape(s1, first) or ()) if first is not None else 0
        if rule is None or not rule(node, rank, flags):
            raise Declined([f"rows: {node.op_type} node {node.name!r} may mix rows"])
        for o in outs:
            if node.op_type == "ZipMap" or _is_batched(_shape(s1, o), _shape(s2, o)):
                batched.add(id(o))
            else:
                raise Declined([f"rows: {node.op_type} node {node.name!r} output is not per row"])
    for v in graph.outputs:
        if id(v) not in batched:
            raise Declined([f"rows: output {v.name!r} is not per row"])


def _shape(s: Shapes, v: Any) -> tuple[int, ...] | None:
    got = s.get(id(v))
    if got is None and v is not None and v.const is not None:
        return tuple(np.asarray(v.const).shape)
    return None if got is None else got[0]
