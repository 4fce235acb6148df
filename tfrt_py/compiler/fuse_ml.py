"""Recognize the loops classic-ML exporters write and replace each with one fused op.

skl2onnx computes the distances of a nearest-neighbour model (KNeighborsClassifier,
KNeighborsRegressor, ...) with a ``Scan`` over the training rows whose body is::

    state_out = Identity(state_in)                # the query rows X (N, K), unchanged
    diff = Sub(state_in, row)                     # row: one training row Y[i] (K,)
    scan_out = ReduceSumSquare(diff, axes=[1], keepdims=0)   # (N,)

so the Scan's outputs are ``X`` and ``D`` (M, N) with ``D[i] = sum((X - Y[i]) ** 2, 1)``:
one Python-level iteration per training row (500 rows: ~2 ms per call). This pass replaces
such a Scan with ``tfrt_py.fused::PairwiseSqDist(Y, X)`` (``kernels/fused/ml.py``: the
same arithmetic in a few vectorized passes) and, when the state output is read, an ``Identity(X)``.

Matched strictly: Scan opset >= 9, one state and one scan input, default scan axes and
directions, a body of exactly those ops (Identity chains allowed; ``Sub`` in either operand
order, the square makes them equal), axes ``[1]``/``[-1]`` as attribute or constant input,
``keepdims=0``, and the state and the scanned tensor of rank 2. Anything else is left to
the general Scan kernel. Model text never reaches code: the replacement is graph data.

skl2onnx's classifiers (GaussianNB, MultinomialNB, MLP, SGD, ...) look their labels up
with ``ArrayFeatureExtractor(classes, ArgMax(scores))``, whose 1-D ``classes`` make the
output (1, N) -- the rows of the batch laid along axis 1 -- and then flatten it with
``Reshape(., [-1])``, possibly after a Cast; an isotonic calibrator
(CalibratedClassifierCV) looks its values up the same way by ``ArgMin``'s indices and
reshapes them to ``[-1, 1]``. The pass makes such a lookup a
``Gather(classes, indices, axis=0)`` (shape of the indices, (N, 1)): the same elements in
the same order once flattened, and a per-row op, so the native tier can lower the whole
model once for every batch size. Matched strictly: ``classes`` a 1-D constant, every path
from the lookup through Casts (or Identities) ending in a ``Reshape`` to a constant shape
with no 0 (which would copy a dim of the (1, N) layout), nothing on the way a graph
output. Indices out of range raise as before (Gather and ArrayFeatureExtractor accept the
same range, ``-len(classes)`` up to ``len - 1``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, TensorType, Value
from ..kernels.fused.domain import DOMAIN
from ..kernels.ml.common import ML_DOMAIN
from .context import PassContext
from .rewrite import Uses

__all__ = ["fuse_ml"]


def fuse_ml(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    nodes: list[Node] = []
    count = 0
    lookups = 0
    for node in graph.nodes:
        if _label_lookup(node, uses, graph.opsets.get("", 13)):
            lookups += 1
        new = _pairwise_scan(node, uses)
        if new is None:
            nodes.append(node)
            continue
        nodes.extend(new)
        count += 1
    if not count and not lookups:
        return "nothing to fuse"
    graph.nodes = nodes
    said = []
    if count:
        graph.opsets.setdefault(DOMAIN, 1)
        said.append(f"{count} pairwise-distance Scan(s) -> PairwiseSqDist")
    if lookups:
        said.append(f"{lookups} label lookup(s) ArrayFeatureExtractor -> Gather")
    return "; ".join(said)


def _label_lookup(node: Node, uses: Uses, opset: int) -> bool:
    """Turn ``node`` into ``Gather(classes, indices)`` in place when it is a label lookup
    whose (1, N) layout only reaches Reshapes to constant shapes (module docstring). True if
    it did."""
    if node.op_type != "ArrayFeatureExtractor" or node.domain != ML_DOMAIN:
        return False
    if len(node.inputs) != 2 or len(node.outputs) != 1 or None in node.inputs:
        return False
    classes, out = node.inputs[0], node.outputs[0]
    if classes is None or classes.const is None or np.asarray(classes.const).ndim != 1:
        return False
    if out is None or not _flattened_only(out, uses):
        return False
    node.op_type, node.domain, node.opset, node.attrs = "Gather", "", opset, {"axis": 0}
    _forget_shapes(out, uses)
    return True


def _flattened_only(v: Value, uses: Uses) -> bool:
    """Every reader of ``v`` is a Cast/Identity leading on to the same, or a Reshape of
    ``v`` (as its data) to a constant shape without a 0 (``[-1]``, a calibrator's ``[-1,
    1]``); ``v`` and the Casts are no graph output."""
    readers = uses.readers.get(id(v), [])
    if not readers or uses.is_output(v):
        return False
    for r in readers:
        if r.domain != "" or list(r.subgraphs()) or not r.inputs or r.inputs[0] is not v:
            return False
        if r.op_type in ("Cast", "Identity") and len(r.inputs) == 1:
            if len(r.outputs) != 1 or r.outputs[0] is None:
                return False
            if not _flattened_only(r.outputs[0], uses):
                return False
        elif r.op_type == "Reshape" and len(r.inputs) == 2 and r.inputs[1] is not None:
            target = r.inputs[1].const
            # a shape of its own (no 0, which would copy a dim of the (1, N) layout): the
            # same elements in the same order either way
            if target is None or 0 in np.asarray(target).reshape(-1).tolist():
                return False
        else:
            return False
    return True


def _forget_shapes(v: Value, uses: Uses) -> None:
    """The lookup's output and the Casts after it change shape ((1, N) to the indices'):
    keep their dtypes, drop their shapes (the Reshapes' outputs keep theirs)."""
    if isinstance(v.type, TensorType):
        v.type = TensorType(v.type.dtype, None)
    for r in uses.readers.get(id(v), []):
        if r.op_type != "Reshape" and r.outputs[0] is not None:
            _forget_shapes(r.outputs[0], uses)


def _rank(v: Value | None) -> int | None:
    if v is None:
        return None
    if v.const is not None:
        return v.const.ndim
    return v.type.rank if isinstance(v.type, TensorType) else None


def _default_list(value: Any) -> bool:
    """An absent scan axes/directions attribute, or the default ``[0]``."""
    return value is None or list(value) == [0]


def _through_identities(v: Value | None) -> Value | None:
    while v is not None and v.producer is not None and v.producer.op_type == "Identity":
        if v.producer.domain != "" or len(v.producer.inputs) != 1:
            break
        v = v.producer.inputs[0]
    return v


def _axes_are_last_of_two(rss: Node) -> bool:
    axes: Any = rss.attrs.get("axes")
    if axes is None and len(rss.inputs) > 1 and rss.inputs[1] is not None:
        const = rss.inputs[1].const
        axes = None if const is None else np.asarray(const).ravel().tolist()
    return axes is not None and len(axes) == 1 and int(axes[0]) in (1, -1)


def _pairwise_scan(node: Node, uses: Uses) -> list[Node] | None:
    if node.op_type != "Scan" or node.domain != "" or node.opset < 9:
        return None
    a = node.attrs
    if a.get("num_scan_inputs") != 1 or not all(
        _default_list(a.get(k))
        for k in (
            "scan_input_axes",
            "scan_input_directions",
            "scan_output_axes",
            "scan_output_directions",
        )
    ):
        return None
    if len(node.inputs) != 2 or len(node.outputs) != 2 or None in node.inputs:
        return None
    state, scanned = node.inputs
    if _rank(state) != 2 or _rank(scanned) != 2:
        return None
    body = a.get("body")
    if not isinstance(body, Graph) or len(body.inputs) != 2 or len(body.outputs) != 2:
        return None
    s_in, row = body.inputs
    work = [n for n in body.nodes if n.op_type != "Identity"]
    if len(work) != 2 or any(n.domain != "" or list(n.subgraphs()) for n in work):
        return None
    sub, rss = work
    if sub.op_type != "Sub" or rss.op_type != "ReduceSumSquare":
        return None
    operands = [_through_identities(v) for v in sub.inputs]
    if len(operands) != 2 or {id(v) for v in operands} != {id(s_in), id(row)}:
        return None
    if _through_identities(rss.inputs[0]) is not sub.outputs[0]:
        return None
    if rss.attrs.get("keepdims", 1) != 0 or not _axes_are_last_of_two(rss):
        return None
    if _through_identities(body.outputs[0]) is not s_in:
        return None
    if _through_identities(body.outputs[1]) is not rss.outputs[0]:
        return None
    state_out, dist = node.outputs
    new: list[Node] = []
    if dist is not None:
        new.append(
            Node("PairwiseSqDist", [scanned, state], [dist], {}, name=f"{node.name}/pairwise",
                 domain=DOMAIN, opset=1)
        )  # fmt: skip
    if state_out is not None and uses.count(state_out):
        new.append(Node("Identity", [state], [state_out], {}, name=f"{node.name}/state",
                        opset=node.opset))  # fmt: skip
    return new
