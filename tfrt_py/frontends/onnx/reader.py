"""Read an ONNX model from a path, bytes or a ModelProto, with clear errors.

External-data weights are *not* loaded here: the importer maps them from their files
(memory-mapped, not copied) and names the tensor when a file is missing or short.
"""

from __future__ import annotations

import os
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from ...errors import ModelLoadError

__all__ = ["read_model"]


def read_model(source: Any) -> tuple[onnx.ModelProto, str]:
    """Return (ModelProto, base directory for external data) for ``source``."""
    if isinstance(source, onnx.ModelProto):
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
    return model
