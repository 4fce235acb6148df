"""Inline ONNX functions at import time.

Two sources: model-local functions (``ModelProto.functions``), and the function bodies
the ONNX schemas define for many ops (Celu, Mish, the losses, ...), used when no kernel
serves an op: the op is decomposed into ops that have kernels. A call node is replaced by
the body with formal inputs/outputs bound to the call's names, internal names made
unique, and ``ref_attr_name`` attributes resolved from the call (or the defaults).
Nested graphs inside a body are not renamed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import onnx

__all__ = ["FunctionInliner", "inline_call", "schema_function"]


def inline_call(
    fn: onnx.FunctionProto,
    call: onnx.NodeProto,
    prefix: str,
    defaults: Mapping[str, onnx.AttributeProto] | None = None,
) -> list[onnx.NodeProto]:
    """The body of ``fn`` as nodes standing in for ``call``.

    Formal inputs/outputs become the call's names; every other name, in the body and in
    its nested graphs alike, gets ``prefix`` (so it cannot collide with the caller's).
    ``defaults`` gives attribute defaults (a schema's); else the function's own.
    """
    rename: dict[str, str] = {"": ""}
    for formal, actual in zip(fn.input, call.input):
        rename[formal] = actual
    for formal in fn.input[len(call.input) :]:
        rename[formal] = ""  # omitted optional input
    for formal, actual in zip(fn.output, call.output):
        rename[formal] = actual
    given = {a.name: a for a in call.attribute}
    if defaults is None:
        defaults = {a.name: a for a in fn.attribute_proto}

    def name(n: str) -> str:
        return rename.get(n, prefix + n)

    def attrs(node: onnx.NodeProto) -> list[onnx.AttributeProto]:
        out = []
        for a in node.attribute:
            if a.ref_attr_name:
                src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue  # optional attribute the call did not set
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
            else:
                b = onnx.AttributeProto()
                b.CopyFrom(a)
                if b.type == onnx.AttributeProto.GRAPH:
                    graph(b.g)
                for g in b.graphs:
                    graph(g)
            out.append(b)
        return out

    def rewrite(node: onnx.NodeProto) -> onnx.NodeProto:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = prefix + (node.name or node.op_type)
        del new.input[:]
        new.input.extend(name(n) for n in node.input)
        del new.output[:]
        new.output.extend(name(n) for n in node.output)
        del new.attribute[:]
        new.attribute.extend(attrs(node))
        return new

    def graph(g: onnx.GraphProto) -> None:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            vi.name = name(vi.name)
        for t in g.initializer:
            t.name = name(t.name)
        nodes = [rewrite(n) for n in g.node]
        del g.node[:]
        g.node.extend(nodes)

    return [rewrite(n) for n in fn.node]


def schema_function(
    call: onnx.NodeProto,
    opset: int,
    input_types: Sequence[onnx.TypeProto | None],
) -> tuple[onnx.FunctionProto, dict[str, onnx.AttributeProto]] | None:
    """The function body the ONNX schema gives ``call``'s op at ``opset`` and the schema's
    attribute defaults, or None."""
    try:
        schema: Any = onnx.defs.get_schema(call.op_type, opset, call.domain)
    except onnx.defs.SchemaError:
        return None
    defaults = {
        k: a.default_value for k, a in schema.attributes.items() if a.default_value.type != 0
    }
    try:
        if schema.has_function:
            versions = [v for v in schema.function_opset_versions if v <= opset]
            if versions:
                raw = schema.get_function_with_opset_version(max(versions))
                return onnx.FunctionProto.FromString(raw), defaults
        if schema.has_context_dependent_function:
            versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
            present = [t for n, t in zip(call.input, input_types) if n]
            if versions and all(t is not None for t in present):
                raw = schema.get_context_dependent_function_with_opset_version(
                    max(versions),
                    call.SerializeToString(),
                    [t.SerializeToString() for t in present if t is not None],
                )
                return (onnx.FunctionProto.FromString(raw), defaults) if raw else None
    except Exception:  # noqa: BLE001 - a schema that cannot build its body: no decomposition
        return None
    return None


class FunctionInliner:
    """Holds a model's local functions by (domain, name). Used on the importer's thread."""

    def __init__(self, functions: Iterable[onnx.FunctionProto]) -> None:
        self._fns = {(f.domain, f.name): f for f in functions}
        self.calls = 0

    def has(self, domain: str, op_type: str) -> bool:
        return (domain, op_type) in self._fns

    def get(self, domain: str, op_type: str) -> onnx.FunctionProto:
        return self._fns[(domain, op_type)]

    def prefix(self, call_name: str) -> str:
        self.calls += 1
        return f"{call_name}/{self.calls}/"
