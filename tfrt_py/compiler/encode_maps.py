"""A map input as the row it becomes: a graph input declared as a map (scikit-learn's
``DictVectorizer`` export: ``map<string,float>``) whose one reader is an
``ai.onnx.ml::DictVectorizer`` is made a ``[1, vocabulary]`` tensor input, the
DictVectorizer node goes, and its readers read the input. The input's ``Value.convert``
(``kernels.ml.encode.MapRow``: the node's own kernel) makes the row from each call's map
when the feeds are checked (``feeds.FeedChecker``), so every executor sees a tensor: the
sync interpreter plans the call, the native tier compiles the model (a map input kept both
off their fast paths). The model still declares the map (``Model.inputs``,
``spec_of``); a map that is no map, or a value that is no number, is an ``InputError``.

Top-level inputs only, never a graph output. Load time (before ``shapes``, which then
sees the row's static shape).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, OpaqueType, TensorType
from ..kernels import KernelContext
from ..kernels.ml.encode import MapRow
from .context import PassContext
from .rewrite import Uses

__all__ = ["encode_maps"]


def _vectorizer(readers: list[Node]) -> Node | None:
    if len(readers) != 1:
        return None
    node = readers[0]
    if node.op_type != "DictVectorizer" or node.domain != "ai.onnx.ml" or len(node.inputs) != 1:
        return None
    return node if node.outputs and node.outputs[0] is not None else None


def encode_maps(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    gone: set[int] = set()
    for v in graph.inputs:
        t = v.type
        if not isinstance(t, OpaqueType) or not t.name.startswith("map<") or uses.is_output(v):
            continue
        node = _vectorizer(uses.readers.get(id(v), []))
        if node is None:
            continue
        vocab = node.attrs.get("string_vocabulary") or node.attrs.get("int64_vocabulary")
        row = node.outputs[0]
        assert row is not None  # (``_vectorizer`` checked)
        dtype = getattr(row.type, "dtype", None) or np.dtype(np.float32)
        if not vocab or uses.is_output(row) or np.dtype(dtype).kind not in "fiu":
            continue
        kdef = ctx.registry.lookup(node.domain, node.op_type, node.opset, node.name)
        fn = kdef.build(KernelContext(node))
        for r in uses.readers.get(id(row), []):
            r.inputs = [v if x is row else x for x in r.inputs]
        v.convert = MapRow(fn, t, v.name)
        v.type = TensorType(np.dtype(dtype), (1, len(vocab)))
        gone.add(id(node))
    if not gone:
        return "nothing to encode"
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    return f"{len(gone)} map inputs made the DictVectorizer's row as their feeds are checked"
