"""The imported-graph cache: a process that loads an ONNX file already imported reads
the graph back instead of importing ``onnx``.

``import onnx`` is most of a fresh process's cost to a small model's first result (~55
ms of ~0.2 s: protobuf, onnx's C++ module, ml_dtypes and ``importlib.metadata``, which
onnx calls for its version). Like OpenVINO's model cache, ``load()`` keeps the graph the
ONNX importer made -- before any pass, so every load option still applies -- in
``graph_codec``'s format under ``<cache dir>/graphs`` (``concurrency.cachedir``: created
0700 and used only when nobody else can write it), keyed by a BLAKE2b digest of the
model's bytes, of the sources that decide what the importer makes (tfrt_py's version among
them) and of the onnx package installed. A hit reads one file; a miss imports as before
and then writes the entry (under a temporary name, renamed).

Which loads use it (``eligible``): a path or bytes source of at most ``MAX_MODEL_BYTES``,
without custom kernels or ``memory_budget``; a model with external data, or with anything
else the codec does not write, is imported every time (``graph_codec.Unsupported``).
``$TFRT_PY_GRAPH_CACHE=0`` turns it off. At most ``MAX_ENTRIES`` files and ``MAX_BYTES``
are kept (the least recently used go). Every failure -- an unsafe or unwritable
directory, a truncated, foreign or corrupt file -- is a miss: the load imports the model
and serves it as without the cache, and a corrupt entry is replaced. Thread- and
process-safe: entries are written whole and renamed into place, and read whole.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading

from ..concurrency.env_switch import switched_off
from ..errors import GraphError
from ..ir.graph import Graph
from ..ir.verifier import verify
from ..metadata import ModelMetadata
from .graph_codec import MAGIC, Unsupported, decode, encode

__all__ = [
    "ENV",
    "MAX_BYTES",
    "MAX_ENTRIES",
    "MAX_MODEL_BYTES",
    "eligible",
    "key",
    "lookup",
    "store",
]

#: ``$TFRT_PY_GRAPH_CACHE=0``: every load imports the ONNX file.
ENV = "TFRT_PY_GRAPH_CACHE"
#: Larger models are not cached (their load is the weights', not onnx's import).
MAX_MODEL_BYTES = 64 << 20
#: Entries and bytes kept; a store beyond either deletes the least recently used.
MAX_ENTRIES = 256
MAX_BYTES = 1 << 30
_SUFFIX = ".tgraph"
#: Files whose code decides what the importer makes from given bytes (relative to tfrt_py).
_SOURCES = (
    "__init__.py",
    "metadata.py",
    "compiler/shapes.py",
    "kernels/module_ops.py",
    "frontends/graph_codec.py",
    "frontends/graph_cache.py",
)
_SOURCE_DIRS = ("frontends/onnx", "ir")
_salt: bytes | None = None


def eligible(nbytes: int) -> bool:
    """Whether a model of ``nbytes`` (a path or bytes source, no custom kernels, no
    ``memory_budget``) goes through the cache."""
    return nbytes <= MAX_MODEL_BYTES and not switched_off(ENV)


def key(data: bytes) -> str:
    """The cache key of model bytes ``data`` under this installation."""
    try:
        from _blake2 import blake2b  # hashlib's own; importing hashlib costs ~8 ms
    except ImportError:  # pragma: no cover - CPython always has it
        from hashlib import blake2b
    h = blake2b(_installation(), digest_size=24)
    h.update(data)
    return h.hexdigest()


def lookup(digest: str) -> tuple[Graph, ModelMetadata] | None:
    """The graph (verified, like an imported one) and metadata stored under ``digest``, or
    None (a miss, whatever the cause)."""
    path = _entry(digest)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            found = decode(f, st.st_size)
        verify(found[0])  # as an imported graph is; a malformed one is a miss
    except (
        OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError,
        GraphError,
    ):  # fmt: skip
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently used goes first
    return found


def store(digest: str, graph: Graph, meta: ModelMetadata) -> bool:
    """Write ``graph`` (as imported, before any pass) and ``meta`` under ``digest``; False
    when the graph holds what the codec does not write or the directory refuses it."""
    path = _entry(digest)
    if path is None:
        return False
    try:
        chunks = encode(graph, meta)
    except Unsupported:
        return False
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.writelines(chunks)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    _prune(os.path.dirname(path))
    return True


def _entry(digest: str) -> str | None:
    """The file of ``digest`` in the graphs directory, or None when it cannot be trusted."""
    from ..concurrency.cachedir import cache_dir, check_dir, make_private

    try:
        d = os.path.join(cache_dir(), "graphs")
        make_private(d)
        check_dir(d)
    except OSError:  # UnsafeCacheDir is one
        return None
    return os.path.join(d, digest + _SUFFIX)


def _prune(d: str) -> None:
    """Delete the least recently used files (entries, and temporaries a killed process
    left) until at most ``MAX_ENTRIES`` files and ``MAX_BYTES`` remain."""
    try:
        entries = []
        for e in os.scandir(d):
            if e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                entries.append((st.st_mtime_ns, st.st_size, e.path))
        entries.sort()
        count, total = len(entries), sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if count <= MAX_ENTRIES and total <= MAX_BYTES:
                return
            os.unlink(path)
            count, total = count - 1, total - size
    except OSError:
        pass


def _installation() -> bytes:
    """What, besides the model's bytes, decides the imported graph: the codec's format and
    the size and mtime of the importer's sources (tfrt_py's ``__init__``, holding its
    version, among them: an upgrade rewrites them all) and of the onnx package's (its shape
    inference types values). Computed once per process; no lock (threads racing on the
    first load compute the same bytes, and a fork never inherits a held lock)."""
    global _salt
    if _salt is None:
        from importlib.util import find_spec

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        files = [os.path.join(root, f) for f in _SOURCES]
        for sub in _SOURCE_DIRS:
            with os.scandir(os.path.join(root, sub)) as it:
                files += sorted(e.path for e in it if e.name.endswith(".py"))
        spec = find_spec("onnx")
        files.append(spec.origin if spec is not None and spec.origin else "")
        parts = [f"format {MAGIC!r}"]
        for f in files:
            try:
                st = os.stat(f)
                parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
            except OSError:
                parts.append(f"{f}:-")
        _salt = "\n".join(parts).encode("utf-8", "surrogateescape")
    return _salt
