"""Fuse a text vectorizer's front into one node: ``[Reshape to [-1]] -> [StringNormalizer]
-> Tokenizer -> [Flatten] -> TfIdfVectorizer`` (pool of strings), what skl2onnx writes for
scikit-learn's CountVectorizer and TfidfVectorizer, becomes
``tfrt_py.fused::TextVectorize`` (kernel: ``kernels/fused/text.py``), which takes each
string once and counts its n-grams without the padded matrix of token strings between
the nodes.

Only where each fused node's output has the next one as its only reader (and is no graph
output), and the normalizer has no stop words (it would drop elements, not tokens). A
Normalizer that alone reads a LinearClassifier's scores comes too. The fused node takes the
place and name of the last node before that Normalizer, and the chain's outputs; the
stages' attributes travel in its ``stages`` attribute. Top-level graph only. Load time.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value
from ..kernels.fused.domain import DOMAIN
from .context import PassContext
from .rewrite import Uses

__all__ = ["fuse_text"]

_ONNX = ("", "ai.onnx")
_ML = ("ai.onnx.ml",)


def _is(node: Node | None, op: str, domains: tuple[str, ...] = _ONNX) -> bool:
    return node is not None and node.op_type == op and node.domain in domains


def _producer(v: Value, op: str, reader: Node, uses: Uses,
              domains: tuple[str, ...] = _ONNX) -> Node | None:  # fmt: skip
    """``v``'s producer where it is an ``op`` with an input and ``reader`` is ``v``'s only
    reader."""
    p = v.producer
    if p is None or not _is(p, op, domains) or uses.only_reader(v) is not reader:
        return None
    return p if p.inputs and p.inputs[0] is not None else None


def _front(tfidf: Node, uses: Uses) -> tuple[list[Node], Value] | None:
    """(the nodes to fuse in graph order, the string input) ending at ``tfidf``."""
    chain = [tfidf]
    v = tfidf.inputs[0] if tfidf.inputs else None
    if v is None:
        return None
    flatten = _producer(v, "Flatten", tfidf, uses)
    if flatten is not None:
        chain.insert(0, flatten)
        v = flatten.inputs[0]
        assert v is not None
    tok = _producer(v, "Tokenizer", chain[0], uses, ("com.microsoft",))
    if tok is None:
        return None
    chain.insert(0, tok)
    v = tok.inputs[0]
    assert v is not None
    norm = _producer(v, "StringNormalizer", tok, uses)
    if norm is not None and not norm.attrs.get("stopwords"):
        chain.insert(0, norm)
        v = norm.inputs[0]
        assert v is not None
    flat = _producer(v, "Reshape", chain[0], uses)  # skl2onnx's [N, 1] -> [N]
    shape = flat.inputs[1] if flat is not None and len(flat.inputs) == 2 else None
    to_1d = shape is not None and shape.const is not None
    if flat is not None and to_1d and shape.const.reshape(-1).tolist() == [-1]:  # type: ignore[union-attr]
        chain.insert(0, flat)
        v = flat.inputs[0]
        assert v is not None
    return chain, v


def _width(tfidf: Node) -> int:
    idx = tfidf.attrs.get("ngram_indexes") or [0]
    return int(max(int(i) for i in idx)) + 1


def _scale(mul: Node, v: Value, width: int) -> np.ndarray | None:
    """The Mul's other operand as a float32 vector of ``width``, where it is a constant
    that broadcasts along the vectorizer's columns only."""
    if len(mul.inputs) != 2 or sum(1 for x in mul.inputs if x is v) != 1:
        return None
    c = mul.inputs[1] if mul.inputs[0] is v else mul.inputs[0]
    k = c.const if c is not None else None
    if k is None or k.dtype != np.float32 or k.ndim > 2 or k.size not in (1, width):
        return None
    if k.ndim == 2 and k.shape[0] != 1:
        return None
    return np.broadcast_to(k.reshape(-1), (width,)).astype(np.float32)


def _reader(v: Value | None, uses: Uses) -> Node | None:
    return uses.only_reader(v) if v is not None else None


def linear_tail(front: Node, uses: Uses, width: int) -> tuple[list[Node], np.ndarray | None]:
    """The ``[Mul] -> [Normalizer L1 | L2] -> LinearClassifier | LinearRegressor`` after
    ``front`` (a vectorizer of ``width`` columns; each node the only reader of the one
    before) and the Mul's scale, or ``([], None)``."""
    tail: list[Node] = []
    scale = None
    v = front.outputs[0] if front.outputs else None
    nxt = _reader(v, uses)
    if nxt is not None and v is not None and _is(nxt, "Mul"):
        scale = _scale(nxt, v, width)
        if scale is None:
            return [], None
        tail.append(nxt)
        nxt = _reader(nxt.outputs[0], uses)
    if nxt is not None and _is(nxt, "Normalizer", _ML):
        if nxt.attrs.get("norm", "MAX") not in ("L1", "L2"):
            return [], None  # MAX: a row's zeros count; the dense nodes run it
        tail.append(nxt)
        nxt = _reader(nxt.outputs[0], uses)
    if nxt is not None and (_is(nxt, "LinearClassifier", _ML) or _is(nxt, "LinearRegressor", _ML)):
        return [*tail, nxt], scale
    return [], None


def scores_normalizer(head: Node, uses: Uses) -> Node | None:
    """The Normalizer that alone reads a LinearClassifier's scores, or None."""
    if not _is(head, "LinearClassifier", _ML) or len(head.outputs) != 2:
        return None
    scores = head.outputs[1]
    nxt = _reader(scores, uses)
    if nxt is None or not _is(nxt, "Normalizer", _ML) or not nxt.outputs:
        return None
    return nxt if nxt.outputs[0] is not None else None


def fuse_text(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    gone: set[int] = set()
    made = heads = 0
    for node in list(graph.nodes):
        if not _is(node, "TfIdfVectorizer") or node.attrs.get("pool_strings") is None:
            continue
        got = _front(node, uses)
        if got is None:
            continue
        front, x = got
        tail, scale = linear_tail(node, uses, _width(node))
        chain = [*front, *tail]
        last = anchor = chain[-1]
        outputs = list(last.outputs)
        post = scores_normalizer(last, uses) if tail else None
        if post is not None:  # the scores' Normalizer (skl2onnx's L1 after a softmax)
            chain.append(post)
            outputs = [last.outputs[0], post.outputs[0]]
            last = post
        stages = tuple((n.op_type, n.domain, n.opset, n.name, tuple(sorted(n.attrs.items())))
                       for n in chain)  # fmt: skip
        attrs: dict[str, object] = {"stages": stages}
        if scale is not None:
            attrs["scale"] = scale
        fused = Node("TextVectorize", [x], outputs, attrs, name=anchor.name,
                     domain=DOMAIN, opset=1)  # fmt: skip
        graph.nodes[graph.nodes.index(anchor)] = fused  # before every reader of its outputs
        gone.update(id(n) for n in chain if n is not anchor)
        made += 1
        heads += bool(tail)
    if not made:
        return "nothing to fuse"
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    graph.opsets.setdefault(DOMAIN, 1)
    return (f"{made} text vectorizers (Tokenizer to TfIdfVectorizer) to one pass over the "
            f"strings, {heads} with their linear model")  # fmt: skip
