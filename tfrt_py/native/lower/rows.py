"""The row rules of rows mode: whether an op keeps each row of a dynamic batch to itself.

A rule ``rule(node, rank, batched) -> bool`` answers for one node, given the rank of its
first input and which of its inputs are batched: True when each output row depends only
on the same row of the batched inputs (no reduction, softmax, concat, slice or transpose
over axis 0, weights that are not data of the row, ...). The ops modules name a rule in
each op's record (``records.OpLowering.rows``); ``rowwise.check_rows`` applies them.

Load time; pure functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...ir import Node

__all__ = [
    "any_rows",
    "axis_not_0",
    "concat",
    "gather",
    "gemm",
    "only_first",
    "reduce",
    "slice_",
    "softmax",
    "transpose",
]


def _axis(node: Node, rank: int, default: int) -> int:
    a = int(node.attrs.get("axis", default))
    return a + rank if a < 0 else a


def _const_ints(v: Any) -> list[int] | None:
    if v is None or v.const is None:
        return None
    return [int(a) for a in np.asarray(v.const).reshape(-1)]


def any_rows(node: Node, rank: int, batched: list[bool]) -> bool:
    return True


def only_first(node: Node, rank: int, batched: list[bool]) -> bool:
    """The first input is the rows; the others are weights (not batched)."""
    return bool(batched) and batched[0] and not any(batched[1:])


def axis_not_0(default: int) -> Callable[[Node, int, list[bool]], bool]:
    def rule(node: Node, rank: int, batched: list[bool]) -> bool:
        return _axis(node, rank, default) != 0

    return rule


def softmax(node: Node, rank: int, batched: list[bool]) -> bool:
    return _axis(node, rank, -1 if node.opset >= 13 else 1) != 0


def reduce(node: Node, rank: int, batched: list[bool]) -> bool:
    axes = _const_ints(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    if axes is None:
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            return False
        axes = [int(a) for a in node.attrs.get("axes", [])]
    if not axes:
        return bool(node.attrs.get("noop_with_empty_axes", 0))
    return all((a + rank if a < 0 else a) != 0 for a in axes) and not any(batched[1:])


def concat(node: Node, rank: int, batched: list[bool]) -> bool:
    return _axis(node, rank, 0) != 0 and all(batched)


def slice_(node: Node, rank: int, batched: list[bool]) -> bool:
    if node.opset < 10:
        axes = [int(a) for a in node.attrs.get("axes", range(len(node.attrs["starts"])))]
    else:
        given = _const_ints(node.inputs[3]) if len(node.inputs) > 3 else None
        n = len(_const_ints(node.inputs[1]) or [])
        axes = given if given is not None else list(range(n))
    return all((a + rank if a < 0 else a) != 0 for a in axes) and not any(batched[1:])


def transpose(node: Node, rank: int, batched: list[bool]) -> bool:
    perm = node.attrs.get("perm", list(range(rank))[::-1])
    return bool(perm) and int(perm[0]) == 0


def gather(node: Node, rank: int, batched: list[bool]) -> bool:
    data_b, idx_b = batched[0], len(batched) > 1 and batched[1]
    axis = _axis(node, rank, 0)
    return (data_b and not idx_b and axis != 0) or (idx_b and not data_b and axis == 0)


def gemm(node: Node, rank: int, batched: list[bool]) -> bool:
    return not node.attrs.get("transA", 0) and only_first(node, rank, batched)
