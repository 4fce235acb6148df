"""Read an ONNX model from a path, bytes or a ModelProto, with clear errors.

External-data weights are *not* loaded here: the importer maps them from their files
(memory-mapped, not copied) and names the tensor when a file is missing or short.
"""

from __future__ import annotations

import os
from typing import Any

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from ...errors import ModelLoadError

__all__ = ["read_model"]


def read_model(source: Any) -> tuple[onnx.ModelProto, str]:
    """Return (ModelProto, base directory for external data) for ``source``."""
    if isinstance(source, onnx.ModelProto):
        _check_text(source, "ONNX model")
        return source, os.getcwd()
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(bytes(source), "<bytes>"), os.getcwd()
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelLoadError(f"model file not found: {path}")
        if os.path.isdir(path):
            raise ModelLoadError(f"model path is a directory, not an ONNX file: {path}")
        with open(path, "rb") as f:
            data = f.read()
        return _parse(data, path), os.path.dirname(os.path.abspath(path))
    raise ModelLoadError(
        f"cannot load a model from {type(source).__name__}: "
        "expected a path, bytes, onnx.ModelProto or tfrt_py.ir.Graph"
    )


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"{where} is empty, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
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
