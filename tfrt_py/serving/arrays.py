""".npy and .npz request bodies to feeds, without trusting a byte of them.

A body comes from a stranger, so nothing is allocated or decompressed on its word:

* an .npz is a zip: its directory is read first, and every member must be an ``.npy``
  named after a model input (at most one per input), stored or deflated (bzip2 and lzma
  cannot be inflated in bounded steps), declaring no more than the decoded limit;
* each ``.npy`` header is read first (``numpy.lib.format``: magic, then the 1.0/2.0
  header, at most ``_MAX_HEADER`` bytes), and the array refused -- before any data is
  read or inflated -- when its dtype holds objects (pickles) or is not one the input
  takes (the input's dtype or one that casts to it safely; strings for a string input),
  or when the bytes it declares (with those of the members before it) pass
  ``max_bytes``;
* the data is then read in chunks into a buffer of exactly the declared size: a member
  that ends early is refused (truncated), and so is one with more data than its header
  declared (a lying header): at most one byte past the declared size is ever inflated.

Status codes: 413 for a declared size over the limit, 400 for everything else. Pure
functions, thread-safe; run on the event loop for small bodies and on a worker thread for
large ones (``body``).
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np
from numpy.lib import format as npformat

from ..feeds import TensorSpec
from .errors import RequestError, names_list

__all__ = ["array_feeds"]

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
_MAX_HEADER = 10_000  # numpy's own default cap on an .npy header
_CHUNK = 1 << 20
_STRING_OBJECT_BYTES = 64  # per element of a string input: the str object it becomes
# What zipfile and numpy's header parser raise on hostile bytes is open-ended (ValueError,
# BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError for encryption,
# tokenize.TokenError and RecursionError from the header's literal_eval, ...): around those
# library calls any Exception means a bad body (400); RequestError passes through.


def array_feeds(body: bytes, specs: Sequence[TensorSpec], max_bytes: int) -> dict[str, Any]:
    """Feeds from an .npy body (one-input models) or an .npz body (arrays named by input);
    ``max_bytes`` bounds the decoded arrays. RequestError (400/413) naming the problem."""
    by_name = {s.name: s for s in specs}
    if body[:4] == ZIP_MAGIC:
        return _npz_feeds(body, by_name, max_bytes)
    if body[:6] != NPY_MAGIC:
        raise RequestError(400, "the body is not a valid .npy/.npz file (no .npy or zip magic)")
    if len(specs) != 1:
        raise RequestError(
            400,
            f"an .npy body holds one array, but the model has {len(specs)} inputs "
            f"{names_list([s.name for s in specs])}; send an .npz with one array per input",
        )
    spec = specs[0]
    arr = _read_npy(io.BytesIO(body), spec, max_bytes, "the .npy body")
    return {spec.name: arr}


def _npz_feeds(body: bytes, by_name: Mapping[str, TensorSpec], max_bytes: int) -> dict[str, Any]:
    try:
        zf = zipfile.ZipFile(io.BytesIO(body))
    except Exception as e:  # noqa: BLE001 - hostile bytes: see above
        raise RequestError(400, f"the body is not a valid .npz (zip) file: {_short(e)}") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > len(by_name):
            raise RequestError(
                400,
                f"the .npz body holds {len(infos)} members, but the model has only "
                f"{len(by_name)} inputs {names_list(list(by_name))}",
            )
        names = [_member_input(info, by_name) for info in infos]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise RequestError(400, f"the .npz body holds input(s) {dup} more than once")
        feeds: dict[str, Any] = {}
        left = max_bytes
        for info, name in zip(infos, names):
            what = f"input {name!r} (.npz member {info.filename!r})"
            try:
                with zf.open(info) as stream:
                    arr = _read_npy(stream, by_name[name], left, what, total=max_bytes)
            except RequestError:
                raise
            except Exception as e:  # noqa: BLE001 - hostile bytes: see above
                raise RequestError(400, f"{what}: cannot be read: {_short(e)}") from None
            left -= _cost(arr.dtype, arr.size, by_name[name])
            feeds[name] = arr
        return feeds


def _member_input(info: zipfile.ZipInfo, by_name: Mapping[str, TensorSpec]) -> str:
    """The input an .npz member holds (its name less ``.npy``), or RequestError."""
    fname = info.filename
    name = fname[:-4] if fname.endswith(".npy") else fname
    if name not in by_name:
        raise RequestError(
            400,
            f"the .npz member {fname[:200]!r} is not an input of the model; its inputs are "
            f"{names_list(list(by_name))} (members are named input.npy, as numpy.savez does)",
        )
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise RequestError(
            400,
            f"the .npz member {fname!r} uses zip compression method {info.compress_type}; "
            "only stored (numpy.savez) and deflate (numpy.savez_compressed) are accepted",
        )
    return name


def _read_npy(
    stream: IO[bytes], spec: TensorSpec, max_bytes: int, what: str, total: int | None = None
) -> np.ndarray:
    """One .npy from ``stream``: header checked against ``spec`` and ``max_bytes`` before
    any data is read; then exactly the declared bytes (and no more)."""
    shape, fortran, dtype = _read_header(stream, what)
    count = math.prod(shape)
    _check_dtype(dtype, spec, what)
    declared = _cost(dtype, count, spec)
    if declared > max_bytes:
        limit = max_bytes if total is None else total
        raise RequestError(
            413,
            f"{what}: the header declares shape {shape} of {dtype} ({declared} bytes decoded), "
            f"over the limit of {limit} decoded bytes per request",
        )
    nbytes = count * dtype.itemsize
    buf = bytearray(nbytes)
    got = _read_into(stream, buf)
    if got < nbytes:
        raise RequestError(
            400,
            f"{what}: truncated: the header declares shape {shape} of {dtype} "
            f"({nbytes} bytes of data), but the data ends after {got} bytes",
        )
    if stream.read(1):
        raise RequestError(
            400,
            f"{what}: more data than the header declares (shape {shape} of {dtype}, "
            f"{nbytes} bytes)",
        )
    arr = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape, order="F" if fortran else "C")
    if not dtype.isnative:
        arr = arr.astype(dtype.newbyteorder("="))
    return arr


def _read_header(stream: IO[bytes], what: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = npformat.read_magic(stream)
        if version == (1, 0):
            header = npformat.read_array_header_1_0(stream, max_header_size=_MAX_HEADER)
        elif version == (2, 0):
            header = npformat.read_array_header_2_0(stream, max_header_size=_MAX_HEADER)
        else:
            raise RequestError(
                400, f"{what}: .npy format version {version} is not supported (1.0 or 2.0)"
            )
    except RequestError:
        raise
    except Exception as e:  # noqa: BLE001 - hostile bytes: see above
        raise RequestError(400, f"{what}: not a valid .npy header: {_short(e)}") from None
    shape, fortran, dtype = header
    if any(d < 0 for d in shape):
        raise RequestError(400, f"{what}: the header declares a negative dim {shape}")
    return tuple(int(d) for d in shape), bool(fortran), dtype


def _check_dtype(dtype: np.dtype, spec: TensorSpec, what: str) -> None:
    if dtype.hasobject:
        raise RequestError(400, f"{what}: object arrays (pickles) are refused; dtype {dtype}")
    if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in "biufcUS":
        raise RequestError(400, f"{what}: dtype {dtype} is not accepted for an input")
    if dtype.itemsize == 0:
        raise RequestError(400, f"{what}: dtype {dtype} has no size")
    want = spec.dtype
    if want is None:
        return
    ok = dtype.kind in "US" if want.kind == "O" else np.can_cast(dtype, want, "safe")
    if not ok:
        raise RequestError(
            400,
            f"input {spec.name!r}: got dtype {dtype}, expected {want}"
            + ("" if want.kind == "O" else " (or a dtype that casts to it safely)"),
        )


def _cost(dtype: np.dtype, count: int, spec: TensorSpec) -> int:
    """Bytes the array costs once decoded and converted to the input's dtype."""
    own = count * dtype.itemsize
    want = spec.dtype
    if want is None:
        return own
    if want.kind == "O":  # strings become one Python str object each
        return own + count * _STRING_OBJECT_BYTES
    return own + (count * want.itemsize if want != dtype else 0)


def _short(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
    return text if len(text) <= limit else text[:limit] + "..."


def _read_into(stream: IO[bytes], buf: bytearray) -> int:
    """Read up to ``len(buf)`` bytes into ``buf`` in bounded chunks; the count read."""
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        chunk = stream.read(min(_CHUNK, len(buf) - got))
        if not chunk:
            break
        view[got : got + len(chunk)] = chunk
        got += len(chunk)
    return got
