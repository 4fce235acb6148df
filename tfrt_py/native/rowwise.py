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

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir import Graph, Node
from ..kernels.fused.domain import DOMAIN
from .scalar import SCALAR_OPS
from .source import Declined

__all__ = ["check_rows"]

Shapes = dict[int, tuple[tuple[int, ...], np.dtype]]
ML = "ai.onnx.ml"


def _axis(node: Node, rank: int, default: int) -> int:
    a = int(node.attrs.get("axis", default))
    return a + rank if a < 0 else a


def _const_ints(v: Any) -> list[int] | None:
    if v is None or v.const is None:
        return None
    return [int(a) for a in np.asarray(v.const).reshape(-1)]


def _ok(node: Node, rank: int, batched: list[bool]) -> bool:
    return True


def _only_first(node: Node, rank: int, batched: list[bool]) -> bool:
    """The first input is the rows; the others are weights (not batched)."""
    return bool(batched) and batched[0] and not any(batched[1:])


def _axis_not_0(default: int) -> Callable[[Node, int, list[bool]], bool]:
    def rule(node: Node, rank: int, batched: list[bool]) -> bool:
        return _axis(node, rank, default) != 0

    return rule


def _softmax(node: Node, rank: int, batched: list[bool]) -> bool:
    return _axis(node, rank, -1 if node.opset >= 13 else 1) != 0


def _reduce(node: Node, rank: int, batched: list[bool]) -> bool:
    axes = _const_ints(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    if axes is None:
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            return False
        axes = [int(a) for a in node.attrs.get("axes", [])]
    if not axes:
        return bool(node.attrs.get("noop_with_empty_axes", 0))
    return all((a + rank if a < 0 else a) != 0 for a in axes) and not any(batched[1:])


def _concat(node: Node, rank: int, batched: list[bool]) -> bool:
    return _axis(node, rank, 0) != 0 and all(batched)


def _slice(node: Node, rank: int, batched: list[bool]) -> bool:
    if node.opset < 10:
        axes = [int(a) for a in node.attrs.get("axes", range(len(node.attrs["starts"])))]
    else:
        given = _const_ints(node.inputs[3]) if len(node.inputs) > 3 else None
        n = len(_const_ints(node.inputs[1]) or [])
        axes = given if given is not None else list(range(n))
    return all((a + rank if a < 0 else a) != 0 for a in axes) and not any(batched[1:])


def _transpose(node: Node, rank: int, batched: list[bool]) -> bool:
    perm = node.attrs.get("perm", list(range(rank))[::-1])
    return bool(perm) and int(perm[0]) == 0


def _gather(node: Node, rank: int, batched: list[bool]) -> bool:
    data_b, idx_b = batched[0], len(batched) > 1 and batched[1]
    axis = _axis(node, rank, 0)
    return (data_b and not idx_b and axis != 0) or (idx_b and not data_b and axis == 0)


def _gemm(node: Node, rank: int, batched: list[bool]) -> bool:
    return not node.attrs.get("transA", 0) and _only_first(node, rank, batched)


_ELEMENTWISE = frozenset(SCALAR_OPS) | {"Cast"}
_RULES: dict[tuple[str, str], Callable[[Node, int, list[bool]], bool]] = {
    **{("", op): _ok for op in _ELEMENTWISE},
    **{("", op): _ok for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")},
    (DOMAIN, "ElementwiseChain"): _ok,
    (DOMAIN, "ElementwiseChainShared"): _ok,
    (DOMAIN, "Linear"): _only_first,
    ("", "MatMul"): _only_first,
    ("", "Gemm"): _gemm,
    ("", "Softmax"): _softmax,
    ("", "LogSoftmax"): _softmax,
    ("", "Concat"): _concat,
    ("", "Slice"): _slice,
    ("", "Transpose"): _transpose,
    ("", "Gather"): _gather,
    ("", "ArgMax"): _axis_not_0(0),
    ("", "ArgMin"): _axis_not_0(0),
    **{("", op): _reduce for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")},
    **{(ML, op): _only_first for op in (
        "TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble", "SVMClassifier",
        "SVMRegressor", "LinearClassifier", "LinearRegressor", "Scaler", "Normalizer",
        "Binarizer", "Imputer", "ZipMap", "ArrayFeatureExtractor")},
    (ML, "FeatureVectorizer"): lambda node, rank, b: all(b),
}  # fmt: skip


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
        rule = _RULES.get((node.domain, node.op_type))
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
