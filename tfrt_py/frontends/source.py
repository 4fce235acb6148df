"""The bytes of a model given as a path or as bytes, and the directory its external data
is read from -- without importing ``onnx`` (the graph cache looks its key up first).

A path source reads external data from the file's own directory; ``base_dir`` may only
repeat that directory (anything else is a ValueError: one model, one directory). A bytes
source has no directory: ``base_dir`` gives it, else it is None (``frontends.onnx``'s
importer then refuses any external-data tensor, naming ``base_dir``; the current directory
is never assumed). A ``base_dir`` that is not an existing directory is a ValueError.
Stateless; any thread.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ModelLoadError

__all__ = ["given_base_dir", "model_bytes"]


def model_bytes(source: Any, base_dir: Any = None) -> tuple[bytes, str, str | None] | None:
    """(the model's bytes, how messages name them, its external-data directory) for a path
    or bytes ``source``; None for any other source (the caller decides about those)."""
    given = None if base_dir is None else given_base_dir(base_dir)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "<bytes>", given
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = os.fspath(source)
    if not isinstance(path, str):
        path = os.fsdecode(path)
    if not os.path.exists(path):
        raise ModelLoadError(f"model file not found: {path}")
    if os.path.isdir(path):
        raise ModelLoadError(f"model path is a directory, not an ONNX file: {path}")
    own = os.path.dirname(os.path.abspath(path))
    if given is not None and os.path.realpath(given) != os.path.realpath(own):
        raise ValueError(
            f"base_dir={given!r} differs from the model file's directory {own!r}: a model "
            "loaded from a path reads its external data from its own directory (pass "
            "base_dir only with bytes or an onnx.ModelProto)"
        )
    with open(path, "rb") as f:
        data = f.read()
    return data, path, own


def given_base_dir(base_dir: Any) -> str:
    """``base_dir`` as an absolute path; ValueError unless it names an existing directory."""
    if not isinstance(base_dir, (str, os.PathLike)):
        raise ValueError(f"base_dir must be a directory path, got {type(base_dir).__name__}")
    path = os.fspath(base_dir)
    if not isinstance(path, str) or "\0" in path or not os.path.isdir(path):
        raise ValueError(f"base_dir must be an existing directory, got {base_dir!r}")
    return os.path.abspath(path)
