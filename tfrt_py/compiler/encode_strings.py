"""String inputs as integer ids at the boundary: a graph input of strings whose every
reader is a ``OneHotEncoder`` on string categories, a ``LabelEncoder`` from string keys
to numbers (skl2onnx's OrdinalEncoder) or a ``CategoryMapper`` (which becomes the
``LabelEncoder`` of its pairs) gets one ``tfrt_py.fused::StringIds`` node
(kernel: ``kernels/fused/ml.py``) mapping each string to its index in the sorted union of
those categories and keys (-1 for any other value), and each reader then takes the ids,
its ``cats_strings``/``keys_strings`` rewritten as their ids in ``cats_int64s``/
``keys_int64s``. The outputs are the same for every input: a string equal to a category
or key gets its column or value, anything else (unseen at fit time, empty, another type)
matches none (the default value; ``zeros=0`` still refuses it).

So the graph's only string op is that first node, which the native tier runs at its
entry (``native/lower/graph.encoded_inputs``): a ColumnTransformer's string columns no
longer keep a pipeline off compiled code. Top-level graph inputs only. Load time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, TensorType, Value
from ..kernels.fused.domain import DOMAIN
from .context import PassContext
from .rewrite import Uses

__all__ = ["encode_strings"]

_ML = "ai.onnx.ml"


def _text(s: Any) -> str:
    return s.decode("utf-8", errors="surrogateescape") if isinstance(s, bytes) else str(s)


#: Per reader: its string attribute, the integer one that replaces it (a CategoryMapper
#: becomes the LabelEncoder of its pairs).
_KEYS = {"OneHotEncoder": ("cats_strings", "cats_int64s"),
         "LabelEncoder": ("keys_strings", "keys_int64s"),
         "CategoryMapper": ("cats_strings", "keys_int64s")}  # fmt: skip


def _categories(node: Node) -> list[str] | None:
    """The string categories of a OneHotEncoder, or the string keys of a LabelEncoder
    (opset 2 or later) with numeric values; None for any other node."""
    if node.op_type not in _KEYS or node.domain != _ML or len(node.inputs) != 1:
        return None
    if node.op_type == "LabelEncoder":
        values = ("values_strings", "values_tensor", "keys_tensor", "default_tensor")
        if node.opset < 2 or any(node.attrs.get(a) is not None for a in values):
            return None
    if node.op_type == "CategoryMapper":  # strings -> int64 (the direction of the input)
        ints = node.attrs.get("cats_int64s") or []
        if len(ints) != len(node.attrs.get("cats_strings") or ()):
            return None
    cats = node.attrs.get(_KEYS[node.op_type][0])
    return [_text(c) for c in cats] if cats else None


def encode_strings(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    made: list[Node] = []
    for v in graph.inputs:
        t = v.type
        if not isinstance(t, TensorType) or t.dtype is None or t.dtype != np.dtype(object):
            continue
        readers = uses.readers.get(id(v), [])
        cats = [_categories(r) for r in readers]
        if not readers or uses.is_output(v) or any(c is None for c in cats):
            continue
        vocab = sorted({c for cs in cats for c in cs or ()})
        index = {c: i for i, c in enumerate(vocab)}
        ids = Value(f"{v.name}/ids", TensorType(np.dtype(np.int64), t.shape))
        made.append(Node("StringIds", [v], [ids], {"vocab": tuple(vocab)},
                         name=f"{readers[0].name}/ids", domain=DOMAIN, opset=1))  # fmt: skip
        for r, cs in zip(readers, cats):
            r.inputs = [ids if x is v else x for x in r.inputs]
            strings, ints = _KEYS[r.op_type]
            attrs = {k: a for k, a in r.attrs.items() if k != strings}
            attrs[ints] = [index[c] for c in cs or ()]
            if r.op_type == "CategoryMapper":  # the same map as a LabelEncoder of ids
                attrs = {ints: attrs[ints], "values_int64s": list(r.attrs["cats_int64s"]),
                         "default_int64": int(r.attrs.get("default_int64", -1))}  # fmt: skip
                r.op_type, r.opset = "LabelEncoder", 2
            r.attrs = attrs
    if not made:
        return "nothing to encode"
    graph.nodes = [*made, *graph.nodes]
    graph.opsets.setdefault(DOMAIN, 1)
    return f"{len(made)} string inputs mapped to ids once, for their encoders"
