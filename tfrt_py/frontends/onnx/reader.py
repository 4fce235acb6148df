"""Read an ONNX model from a path, bytes or a ModelProto, with clear errors.

External-data weights are *not* loaded here: the importer maps them from their files
(memory-mapped, not copied; ``external.open_external`` decides which files may be opened)
and names the tensor when a file is refused, missing or short. This module only decides
the directory they are read from (``frontends.source``, which reads a path's bytes).
"""

from __future__ import annotations

from typing import Any

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from ...errors import ModelLoadError
from ..source import given_base_dir, model_bytes

__all__ = ["parse_model", "read_model"]


def read_model(source: Any, base_dir: Any = None) -> tuple[onnx.ModelProto, str | None]:
    """Return (ModelProto, directory its external data is read from) for ``source``: a
    path, bytes or a ModelProto. The directory follows ``frontends.source.model_bytes``'s
    rule; a ModelProto has none unless ``base_dir`` gives it."""
    if isinstance(source, onnx.ModelProto):
        given = None if base_dir is None else given_base_dir(base_dir)
        _check_text(source, "ONNX model")
        return source, given
    read = model_bytes(source, base_dir)
    if read is None:
        raise ModelLoadError(
            f"cannot load a model from {type(source).__name__}: "
            "expected a path, bytes, onnx.ModelProto or tfrt_py.ir.Graph"
        )
    data, where, directory = read
    return parse_model(data, where), directory


def parse_model(data: bytes, where: str) -> onnx.ModelProto:
    """``data`` parsed as an ONNX model; ModelLoadError saying why not (``where`` names it)."""
    if not data:
        raise ModelLoadError(f"{where} is empty, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        said = "depth" in str(e).lower() or "recursion" in str(e).lower()
        # protobuf 6's parser gives no reason: measure the nesting ourselves
        if said or _nesting(data, onnx.ModelProto.DESCRIPTOR, NEST_LIMIT) >= NEST_LIMIT:
            raise ModelLoadError(
                f"{where} is not a valid ONNX model: its messages nest deeper than the "
                f"protobuf parser allows (subgraphs nested about 30 levels deep): {e}"
            ) from e
        raise ModelLoadError(
            f"{where} is not a valid ONNX model ({len(data)} bytes; protobuf parse failed: {e}); "
            "is the file truncated or of another format?"
        ) from e
    if not model.HasField("graph"):
        raise ModelLoadError(f"{where} parsed but holds no graph: not an ONNX model")
    if not model.opset_import and model.ir_version == 0:
        raise ModelLoadError(f"{where} has no ir_version and no opset_import: not an ONNX model")
    _check_text(model, where)
    return model


#: Sub-message depth past which protobuf's parsers refuse a message (upb's default).
NEST_LIMIT = 100


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); position -1 when the bytes end inside it."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    return 0, -1


def _nesting(data: bytes, desc: Any, limit: int) -> int:
    """How deep sub-messages nest in ``data`` (wire bytes of a ``desc`` message), counted
    up to ``limit``; malformed bytes end a message's scan. Iterative and linear in
    ``len(data)``: a message's bytes are read once, at its own level (its sub-messages
    are skipped by length there and read when their turn comes)."""
    stack = [(0, len(data), desc, 1)]
    deepest = 0
    while stack and deepest < limit:
        pos, end, d, depth = stack.pop()
        deepest = max(deepest, depth)
        while 0 <= pos < end:
            key, pos = _varint(data, pos)
            wire = key & 7
            if pos < 0 or wire in (3, 4) or wire > 5:
                break
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                n, pos = _varint(data, pos)
                f = d.fields_by_number.get(key >> 3) if pos >= 0 else None
                if f is not None and f.message_type is not None and pos + n <= end:
                    stack.append((pos, pos + n, f.message_type, depth + 1))
                pos = pos + n if pos >= 0 else -1
    return deepest


_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def _check_text(model: onnx.ModelProto, where: str) -> None:
    """Every string field (names, op types, domains) must be UTF-8, as ONNX requires.

    Protobuf's proto2 parser accepts any bytes there and hands them back as ``bytes``, not
    ``str``; a corrupted file would then fail deep in the importer. Cost: one visit per
    message (tensor payloads are ``bytes`` or numbers and are not walked).
    """
    stack: list[tuple[Message, str]] = [(model, "model")]
    while stack:
        msg, path = stack.pop()
        for fd, value in msg.ListFields():
            if fd.type == _STRING:
                items = value if fd.is_repeated else (value,)
                if any(not isinstance(x, str) for x in items):
                    raise ModelLoadError(
                        f"{where} is not a valid ONNX model: {path}.{fd.name} is not UTF-8 text "
                        "(is the file corrupted?)"
                    )
            elif fd.type == _MESSAGE:
                if fd.is_repeated:
                    stack.extend((m, f"{path}.{fd.name}[{i}]") for i, m in enumerate(value))
                else:
                    stack.append((value, f"{path}.{fd.name}"))
