"""Inline model-local ONNX functions (``ModelProto.functions``) at import time.

A call node is replaced by the function body with formal inputs/outputs bound to the
call's names, internal names made unique, and ``ref_attr_name`` attributes resolved from
the call (or the function's defaults). Nested graphs inside a body are not renamed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import onnx

__all__ = ["FunctionInliner"]


class FunctionInliner:
    """Holds a model's local functions by (domain, name). Used on the importer's thread."""

    def __init__(self, functions: Iterable[onnx.FunctionProto]) -> None:
        self._fns = {(f.domain, f.name): f for f in functions}
        self._calls = 0

    def has(self, domain: str, op_type: str) -> bool:
        return (domain, op_type) in self._fns

    def expand(self, call: onnx.NodeProto, call_name: str) -> Iterator[onnx.NodeProto]:
        fn = self._fns[(call.domain, call.op_type)]
        self._calls += 1
        prefix = f"{call_name}/{self._calls}/"
        rename: dict[str, str] = {"": ""}
        for formal, actual in zip(fn.input, call.input):
            rename[formal] = actual
        for formal in fn.input[len(call.input) :]:
            rename[formal] = ""  # omitted optional input
        for formal, actual in zip(fn.output, call.output):
            rename[formal] = actual
        given = {a.name: a for a in call.attribute}
        defaults = {a.name: a for a in fn.attribute_proto}
        for node in fn.node:
            new = onnx.NodeProto()
            new.CopyFrom(node)
            new.name = prefix + (node.name or node.op_type)
            new.ClearField("input")
            new.input.extend(rename.get(n, prefix + n) if n else "" for n in node.input)
            del new.output[:]
            for n in node.output:
                if n and n not in rename:
                    rename[n] = prefix + n
                new.output.append(rename.get(n, "") if n else "")
            del new.attribute[:]
            for a in node.attribute:
                if a.ref_attr_name:
                    src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if src is None:
                        continue  # the attribute is optional and the call did not set it
                    b = onnx.AttributeProto()
                    b.CopyFrom(src)
                    b.name = a.name
                    new.attribute.append(b)
                else:
                    new.attribute.append(a)
            yield new
