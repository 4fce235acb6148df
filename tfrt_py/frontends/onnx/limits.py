"""Load-time limits on what a model file can make the importer build.

A model file comes from a stranger, and a few kilobytes of ONNX can describe far more work
than they contain: model-local functions that call each other twice per level inline into
2**depth nodes, a function that calls itself never ends, subgraphs nested thousands deep
exhaust the stack (Python's, or a C++ one in protobuf or ONNX shape inference), a sparse
tensor declares any dense shape. Each limit below turns such a model into a
``ModelLoadError`` that names the limit, before the work is done. They are far above what
real models use; a caller who needs more may raise one for the whole process before
``load`` (``tfrt_py.frontends.onnx.limits.MAX_INLINED_NODES = 5_000_000``): each load reads
the current values. See docs/security.md.

``check_nesting`` is the static pre-check: it walks the proto iteratively (no recursion) and
runs before anything recursive touches the model (ONNX shape inference, protobuf's
serializer, the importer).
"""

from __future__ import annotations

import onnx

from ...errors import ModelLoadError

__all__ = [
    "MAX_FUNCTION_DEPTH",
    "MAX_GRAPH_DEPTH",
    "MAX_INLINED_BYTES",
    "MAX_INLINED_NODES",
    "MAX_SPARSE_DENSE_BYTES",
    "check_nesting",
]

#: Nodes that inlining functions may add to a model in all (model-local function bodies,
#: counted after their own calls are inlined, and the ONNX schema bodies that decompose
#: ops without a kernel). The largest real graphs have a few hundred thousand nodes.
MAX_INLINED_NODES = 1_000_000

#: Bytes of NodeProtos that inlining may copy in all (a body's nodes with their attributes,
#: copied once per call): bounds a large attribute repeated through many calls.
MAX_INLINED_BYTES = 1 << 30

#: Calls of functions inside functions (a model-local function calling another counts one
#: level; schema decompositions count too). Real models nest a handful.
MAX_FUNCTION_DEPTH = 64

#: Subgraphs (If/Loop/Scan bodies, graph attributes) nested inside subgraphs. Protobuf's
#: parser already stops a serialized model at about 30; a ModelProto built in memory is
#: checked here.
MAX_GRAPH_DEPTH = 64

#: The dense size, in bytes, that a sparse initializer or a Constant's ``sparse_value``
#: may expand to (the importer densifies them).
MAX_SPARSE_DENSE_BYTES = 2 << 30

_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS


def check_nesting(model: onnx.ModelProto) -> None:
    """ModelLoadError when the main graph, or a model-local function's body, nests
    subgraphs deeper than ``MAX_GRAPH_DEPTH``. Iterative: safe on any depth."""
    limit = MAX_GRAPH_DEPTH
    roots: list[tuple[list[onnx.NodeProto], str]] = [(list(model.graph.node), "main graph")]
    roots += [(list(f.node), f"function {f.domain}::{f.name}") for f in model.functions]
    for nodes, where in roots:
        stack = [(n, 1) for n in nodes]
        while stack:
            node, depth = stack.pop()
            for a in node.attribute:
                subs = [a.g] if a.type == _GRAPH else list(a.graphs) if a.type == _GRAPHS else []
                for g in subs:
                    if depth > limit:
                        raise ModelLoadError(
                            f"{where}: node {node.name or node.op_type!r} nests subgraphs more "
                            f"than {limit} levels deep (limit MAX_GRAPH_DEPTH in "
                            "tfrt_py.frontends.onnx.limits)"
                        )
                    stack.extend((n, depth + 1) for n in g.node)
