"""``Model.metadata``: what an ONNX file says about itself (onnxruntime's
``InferenceSession.get_modelmeta()``), read once at load.

Every field is model text from a stranger: it is kept as data (strings, a dict), shown
only through ``repr`` and never pasted into generated code. Long fields are cut at
``MAX_TEXT`` characters and ``metadata_props`` at ``MAX_PROPS`` entries, so a hostile file
cannot make ``describe()`` or a server's metadata answer huge. Immutable.
"""

from __future__ import annotations

from dataclasses import field, fields
from types import MappingProxyType
from typing import Any

from .records import record

__all__ = ["MAX_PROPS", "MAX_TEXT", "ModelMetadata", "from_graph", "from_proto"]

#: Characters kept of each text field (the rest is cut, marked with "...").
MAX_TEXT = 4096
#: ``metadata_props`` entries kept (in the file's order).
MAX_PROPS = 256


@record(frozen=True)
class ModelMetadata:
    """``producer_name``/``producer_version`` (the exporter: "pytorch", "skl2onnx", ...),
    ``domain``, ``model_version``, ``doc_string``, ``graph_name``, ``graph_doc_string``,
    ``metadata_props`` (the file's key/value pairs, read-only), ``ir_version`` and
    ``opset_imports`` (domain -> version). A model built in Python (``tfrt_py.ir.Graph``)
    has its graph's name and opsets and nothing else."""

    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    model_version: int = 0
    doc_string: str = ""
    graph_name: str = ""
    graph_doc_string: str = ""
    metadata_props: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ir_version: int = 0
    opset_imports: MappingProxyType[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def as_dict(self) -> dict[str, Any]:
        """Every field, the mappings as plain dicts (JSON-ready)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["metadata_props"] = dict(self.metadata_props)
        out["opset_imports"] = dict(self.opset_imports)
        return out


def _text(s: Any) -> str:
    s = str(s)
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + "..."


def from_proto(proto: Any) -> ModelMetadata:
    """The metadata of an ``onnx.ModelProto`` (fields it lacks are empty)."""
    props: dict[str, str] = {}
    for p in list(proto.metadata_props)[:MAX_PROPS]:
        props[_text(p.key)] = _text(p.value)
    opsets = {str(o.domain): int(o.version) for o in proto.opset_import}
    return ModelMetadata(
        producer_name=_text(proto.producer_name),
        producer_version=_text(proto.producer_version),
        domain=_text(proto.domain),
        model_version=int(proto.model_version),
        doc_string=_text(proto.doc_string),
        graph_name=_text(proto.graph.name),
        graph_doc_string=_text(proto.graph.doc_string),
        metadata_props=MappingProxyType(props),
        ir_version=int(proto.ir_version),
        opset_imports=MappingProxyType(opsets),
    )


def from_graph(name: str, opsets: dict[str, int]) -> ModelMetadata:
    """The metadata of a model built in Python: its graph's name and opsets."""
    return ModelMetadata(graph_name=_text(name), opset_imports=MappingProxyType(dict(opsets)))
