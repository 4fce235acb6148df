"""ONNX frontend: read a model (path, bytes or ModelProto) and import it into the IR."""

from __future__ import annotations

from .importer import OwnTypes as OwnTypes
from .importer import import_model as import_model
from .reader import read_model as read_model

__all__ = ["OwnTypes", "import_model", "read_model"]
