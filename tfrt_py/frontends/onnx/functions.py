"""Inline ONNX functions at import time.

Two sources: model-local functions (``ModelProto.functions``), and the function bodies
the ONNX schemas define for many ops (Celu, Mish, the losses, ...), used when no kernel
serves an op: the op is decomposed into ops that have kernels. A call node is replaced by
the body with formal inputs/outputs bound to the call's names, internal names made
unique, and ``ref_attr_name`` attributes resolved from the call (or the defaults).
Nested graphs inside a body are not renamed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import onnx

from ...errors import ModelLoadError
from . import limits

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
    """Holds a model's local functions by (domain, name), and what inlining them costs.
    Used on the importer's thread.

    ``expansion(domain, name)`` is the static check made before a call is inlined: how many
    nodes the call becomes once every call inside it (in nested graphs too) is inlined, and
    how deep its calls nest. Memoized per function, so a chain of functions that each call
    the next twice costs one visit per function, not 2**depth; recursion (direct or
    through other functions) and nesting past ``limits.MAX_FUNCTION_DEPTH`` are a
    ModelLoadError naming the call chain. ``account`` keeps the running totals of inlined
    nodes and bytes against ``limits.MAX_INLINED_NODES`` / ``MAX_INLINED_BYTES``.
    """

    def __init__(self, functions: Iterable[onnx.FunctionProto]) -> None:
        self._fns = {(f.domain, f.name): f for f in functions}
        self._expansion: dict[tuple[str, str], tuple[int, int]] = {}
        self.calls = 0
        self.nodes = 0  # inlined so far, in all
        self.bytes = 0

    def has(self, domain: str, op_type: str) -> bool:
        return (domain, op_type) in self._fns

    def get(self, domain: str, op_type: str) -> onnx.FunctionProto:
        return self._fns[(domain, op_type)]

    def prefix(self, call_name: str) -> str:
        self.calls += 1
        return f"{call_name}/{self.calls}/"

    def expansion(self, domain: str, op_type: str) -> tuple[int, int]:
        """(nodes, call depth) of one call of local function ``domain::op_type``, fully
        inlined. Raises ModelLoadError for recursion, nesting deeper than
        ``MAX_FUNCTION_DEPTH`` or more than ``MAX_INLINED_NODES`` nodes."""
        return self._expand((domain, op_type), [])

    def _expand(self, key: tuple[str, str], chain: list[tuple[str, str]]) -> tuple[int, int]:
        known = self._expansion.get(key)
        if known is not None:
            return known
        if key in chain:
            calls = " -> ".join(_fmt(k) for k in [*chain[chain.index(key) :], key])
            raise ModelLoadError(f"model-local function {_fmt(key)} calls itself: {calls}")
        if len(chain) >= limits.MAX_FUNCTION_DEPTH:
            raise ModelLoadError(
                f"model-local functions nest more than {limits.MAX_FUNCTION_DEPTH} calls deep "
                f"({' -> '.join(_fmt(k) for k in chain[:3])} -> ...; limit MAX_FUNCTION_DEPTH "
                "in tfrt_py.frontends.onnx.limits)"
            )
        chain.append(key)
        nodes, depth = 0, 0
        for node in _all_nodes(self._fns[key].node):
            callee = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
            if callee in self._fns:
                n, d = self._expand(callee, chain)
                nodes, depth = nodes + n, max(depth, d)
            else:
                nodes += 1
            if nodes > limits.MAX_INLINED_NODES:
                raise ModelLoadError(
                    f"model-local function {_fmt(chain[0])} would inline into more than "
                    f"{limits.MAX_INLINED_NODES:,} nodes (limit MAX_INLINED_NODES in "
                    "tfrt_py.frontends.onnx.limits)"
                )
        chain.pop()
        self._expansion[key] = (nodes, depth + 1)
        return nodes, depth + 1

    def check_calls(self, graph: onnx.GraphProto) -> None:
        """The static check of every call of a local function in ``graph`` (nested graphs
        too), before anything expands them (ONNX shape inference infers a function body
        once per call, so it would blow up as the inlining would)."""
        total = 0
        for node in _all_nodes(graph.node):
            domain = "" if node.domain == "ai.onnx" else node.domain
            if self.has(domain, node.op_type):
                total += self.expansion(domain, node.op_type)[0]
                if total > limits.MAX_INLINED_NODES:
                    raise ModelLoadError(
                        f"inlining the model's local functions would add more than "
                        f"{limits.MAX_INLINED_NODES:,} nodes (limit MAX_INLINED_NODES in "
                        "tfrt_py.frontends.onnx.limits)"
                    )

    def account(self, nodes: int, copied: Sequence[onnx.NodeProto] = ()) -> None:
        """Add ``nodes`` to the inlined total and ``copied``'s bytes to the copied total;
        ModelLoadError past ``MAX_INLINED_NODES`` / ``MAX_INLINED_BYTES``."""
        self.nodes += nodes
        if self.nodes > limits.MAX_INLINED_NODES:
            raise ModelLoadError(
                f"inlining functions would add more than {limits.MAX_INLINED_NODES:,} nodes "
                "to the model (limit MAX_INLINED_NODES in tfrt_py.frontends.onnx.limits)"
            )
        self.bytes += sum(n.ByteSize() for n in copied)
        if self.bytes > limits.MAX_INLINED_BYTES:
            raise ModelLoadError(
                f"inlining functions would copy more than {limits.MAX_INLINED_BYTES:,} bytes "
                "of nodes (limit MAX_INLINED_BYTES in tfrt_py.frontends.onnx.limits)"
            )


def _fmt(key: tuple[str, str]) -> str:
    return f"{key[0]}::{key[1]}" if key[0] else key[1]


def _all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """``nodes`` and every node of their nested graphs, iteratively."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                stack.extend(a.g.node)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    stack.extend(g.node)
