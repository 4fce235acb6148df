"""Fuse a DictVectorizer with the linear model that reads it: ``DictVectorizer ->
[Normalizer L1 | L2] -> LinearClassifier | LinearRegressor [-> Normalizer of the
scores]``, what skl2onnx writes for scikit-learn's ``DictVectorizer`` before a linear
estimator, becomes ``tfrt_py.fused::DictLinear`` (kernel: ``kernels/fused/dicts.py``),
which multiplies each map's known keys by their coefficients without the dense
``[N, vocabulary]`` row between the nodes.

Only for a vocabulary of more than ``SPARSE_MIN_WIDTH`` keys (a smaller dense row costs
less than the sparse path's Python: at 40 keys the nodes took 7.4 µs, the fused node
11; at 10,000 keys 52.7 against 19 µs), where each node's output has the next one as its
only reader (and is no graph output), and without a Mul between the vectorizer and the
model. The fused node takes the
place and name of the linear model and the chain's outputs; the stages' attributes
travel in its ``stages`` attribute, as ``fuse_text``'s, and the vectorizer's output dtype
in ``dtype``. Top-level graph only. Load time.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from ..kernels.fused.domain import DOMAIN
from .context import PassContext
from .fuse_text import linear_tail, scores_normalizer
from .rewrite import Uses

__all__ = ["SPARSE_MIN_WIDTH", "fuse_dict"]

#: The smallest vocabulary fused (see the module docstring).
SPARSE_MIN_WIDTH = 1024


def _width(vectorizer: Node) -> int:
    vocab = vectorizer.attrs.get("string_vocabulary") or vectorizer.attrs.get("int64_vocabulary")
    return len(vocab or ())


def fuse_dict(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    gone: set[int] = set()
    made = 0
    for node in list(graph.nodes):
        if node.op_type != "DictVectorizer" or node.domain != "ai.onnx.ml":
            continue
        if len(node.inputs) != 1 or node.inputs[0] is None or _width(node) <= SPARSE_MIN_WIDTH:
            continue
        tail, scale = linear_tail(node, uses, _width(node))
        if not tail or scale is not None:
            continue
        chain = [node, *tail]
        anchor = chain[-1]
        outputs = list(anchor.outputs)
        post = scores_normalizer(anchor, uses)
        if post is not None:  # the scores' Normalizer (skl2onnx's L1 after a softmax)
            chain.append(post)
            outputs = [anchor.outputs[0], post.outputs[0]]
        stages = tuple((n.op_type, n.domain, n.opset, n.name, tuple(sorted(n.attrs.items())))
                       for n in chain)  # fmt: skip
        t = node.outputs[0].type if node.outputs and node.outputs[0] is not None else None
        dtype = getattr(t, "dtype", None) or np.dtype(np.float32)  # the dense row's
        attrs = {"stages": stages, "dtype": str(dtype)}
        fused = Node("DictLinear", [node.inputs[0]], outputs, attrs,
                     name=anchor.name, domain=DOMAIN, opset=1)  # fmt: skip
        graph.nodes[graph.nodes.index(anchor)] = fused  # before every reader of its outputs
        gone.update(id(n) for n in chain if n is not anchor)
        made += 1
    if not made:
        return "nothing to fuse"
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    graph.opsets.setdefault(DOMAIN, 1)
    return f"{made} DictVectorizers with their linear model, on each map's known keys"
