"""Where an external-data tensor's bytes live, checked without reading them
(``external_ref``: for the streaming loader, which reads them later into its own buffers,
``tfrt_py.streaming``), and the same bytes memory-mapped read-only (``read_external``:
``tensors.to_array``). Imported only for models with external data.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import onnx

from ...errors import ModelLoadError
from ...records import record
from .external import open_external
from .tensor_meta import onnx_dtype, tensor_shape

__all__ = ["ExternalRef", "external_ref", "read_external"]


@record(frozen=True)
class ExternalRef:
    """Where an external-data tensor's bytes live: ``nbytes`` little-endian bytes of
    ``dtype`` at ``offset`` in the file ``location`` inside ``base_dir`` (``path``: the
    absolute path, as checked at load). Immutable; made at load. Whoever opens the file
    later opens it with ``external.open_external(base_dir, location, name)``, which checks
    it again."""

    name: str
    path: str
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]
    base_dir: str = ""
    location: str = ""


def external_ref(t: onnx.TensorProto, base_dir: str | None) -> ExternalRef:
    """Check and record where ``t``'s external data lives, without reading it.

    Raises ModelLoadError naming the tensor when ``base_dir`` is None (a bytes or proto
    source without ``load(base_dir=)``), the location is refused (``external.open_external``:
    absolute, ``..``, symlinks, outside the directory, not a regular file), the dims are
    bad, ``offset``/``length`` are not non-negative integers, ``length`` differs from the
    tensor's declared size, or the file is too short for ``offset + nbytes``.
    """
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if base_dir is None:
        raise ModelLoadError(
            f"tensor {t.name!r} has external data (location {location!r}) but the model was "
            "not loaded from a file, so there is no directory to read it from: pass "
            "load(..., base_dir=DIR), the directory its locations are relative to"
        )
    dtype = onnx_dtype(t.data_type)
    if dtype.kind == "O":
        raise ModelLoadError(f"tensor {t.name!r}: string tensors cannot be external data")
    shape = tensor_shape(t)
    nbytes = math.prod(shape) * dtype.itemsize
    offset = _int_field(t.name, info, "offset", 0)
    length = _int_field(t.name, info, "length", nbytes)
    if length != nbytes:
        raise ModelLoadError(
            f"tensor {t.name!r}: external data length {length} does not match the "
            f"{nbytes} bytes its dims {list(shape)} declare"
        )
    fd, path = open_external(base_dir, location, t.name)
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if offset > size or nbytes > size - offset:
        raise ModelLoadError(
            f"tensor {t.name!r}: external data file {location!r} is too short "
            f"(needs {nbytes} bytes at offset {offset}, file has {size})"
        )
    le = dtype if sys.byteorder == "little" else dtype.newbyteorder("<")  # ONNX data is LE
    return ExternalRef(t.name, path, offset, nbytes, le, shape, os.path.abspath(base_dir),
                       location)  # fmt: skip


def _int_field(name: str, info: dict[str, str], key: str, default: int) -> int:
    raw = info.get(key)
    if raw is None:
        return default
    text = raw.strip()
    if not text.isdigit() or not text.isascii():
        raise ModelLoadError(
            f"tensor {name!r}: external data {key} {raw!r} is not a non-negative integer"
        )
    return int(text)


def read_external(t: onnx.TensorProto, base_dir: str | None) -> np.ndarray:
    """``t``'s external data, memory-mapped read-only (checked by ``external_ref``)."""
    ref = external_ref(t, base_dir)
    if ref.nbytes == 0:
        return np.zeros(ref.shape, ref.dtype)
    fd, _ = open_external(ref.base_dir, ref.location, ref.name)
    with os.fdopen(fd, "rb") as f:  # the mapping keeps its own reference to the file
        mm = np.memmap(f, dtype=ref.dtype, mode="r", offset=ref.offset, shape=ref.shape)
    return np.asarray(mm)  # a plain ndarray view; the mapping stays alive through .base
