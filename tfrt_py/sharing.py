"""Weights shared across forked workers: ``share_weights(model, ...)`` before the fork.

A pre-forking server (``tfrt-py serve --workers N``, gunicorn ``--preload``) loads its
models once and forks. Pages the children only read stay shared, but only while nobody
writes them -- and the weights' pages are shared as *anonymous* memory of the parent,
which the kernel accounts to each process in full once the parent goes away, and which
Python's allocator may write. External-data weights are already file-backed (memory-mapped
read-only by the importer, ``frontends/onnx/tensors.py``). ``share_weights`` makes the
others file-backed too:

1. it walks everything a Model holds (graph constants, the program's constants, arrays
   kernels and the native tier derived from them at load) and collects every array of at
   least ``min_bytes`` whose memory is anonymous (``/proc/self/maps``);
2. it writes the whole pages inside each array's buffer to one cache file, created
   privately (a fresh 0700 directory from ``mkdtemp`` under ``/dev/shm`` when usable,
   checked like the native cache dir; the file ``O_EXCL | O_NOFOLLOW``, 0600), hashing
   what it writes;
3. it maps each file region back over the very pages it came from (``mmap(MAP_FIXED |
   MAP_PRIVATE)``), after checking the file region's SHA-256 against the memory's: the
   arrays keep their addresses, so no reference anywhere changes, and the contents are
   the same bytes. A page written later is copied for the writer alone (``MAP_PRIVATE``);
   the file never changes;
4. it removes the file and its directory at once: the mappings keep the data, forked
   children inherit them, and nothing is left behind however the server ends.

The arrays it remapped are kept alive for the life of the process (``_PINNED``): their
memory must never return to the allocator, which might reuse it (copy-on-write, harmless)
or hand it back to the kernel in ways that assume anonymous memory.

Who calls what: ``share_weights`` runs on one thread of the parent, before the fork and
before any other thread could write the arrays (calls may run meanwhile: they only read
constants, and a page is never absent -- ``MAP_FIXED`` replaces it atomically).
``describe_lines`` (``Model.describe()``) reads ``/proc/self/maps``; any thread. Linux only:
elsewhere ``share_weights`` does nothing and says so.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import gc
import hashlib
import mmap
import os
import sys
import tempfile
import threading
import types
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import field
from typing import Any

import numpy as np

from .records import record

__all__ = ["MIN_SHARED_BYTES", "SharedWeights", "describe_lines", "share_weights"]

#: Arrays smaller than this stay private: at most two of their pages could be shared.
MIN_SHARED_BYTES = 64 * 1024
#: Objects visited at most while looking for a model's arrays (a bound, never reached by
#: a model: an MLP visits about 2,000).
MAX_WALK = 2_000_000
PAGE = mmap.PAGESIZE
CACHE_PREFIX = "tfrt_py-weights-"

_PINNED: list[Any] = []  # remapped arrays: never freed (see the module docstring)
_LOCK = threading.Lock()


@record
class SharedWeights:
    """What ``share_weights`` did: ``shared_bytes`` in ``arrays`` arrays moved to the
    shared cache, ``file_bytes`` already file-backed (external data), ``private_bytes``
    left private (below ``min_bytes``, or the partial pages at an array's ends);
    ``reason`` says why nothing was done, when nothing was."""

    shared_bytes: int = 0
    arrays: int = 0
    file_bytes: int = 0
    private_bytes: int = 0
    reason: str = ""
    regions: list[tuple[int, int]] = field(default_factory=list)

    def __str__(self) -> str:
        if self.reason:
            return f"weights not shared: {self.reason}"
        return (
            f"weights shared across forks: {_size(self.shared_bytes)} moved to the shared "
            f"cache ({self.arrays} arrays), {_size(self.file_bytes)} memory-mapped from "
            f"external data, {_size(self.private_bytes)} private"
        )


def share_weights(*models: Any, min_bytes: int = MIN_SHARED_BYTES) -> SharedWeights:
    """Make the weights of ``models`` (tfrt_py Models, or any objects holding arrays)
    file-backed and shared with processes forked afterwards; see the module docstring.
    Idempotent (a second call finds nothing anonymous). Raises OSError when the cache
    file cannot be made or mapped (the arrays are then unchanged, or remapped to identical
    bytes). Call it in the parent, before forking, with no call writing into a model. A
    Model a cold process built on NumPy paths is first switched to the compiled kernels
    (``Model.wait_compiled``), so what they hold is shared as well."""
    if not sys.platform.startswith("linux"):
        return SharedWeights(reason="only on Linux (needs /proc/self/maps and mmap MAP_FIXED)")
    for m in models:  # a cold start's switch first: the compiled kernels' packed copies
        wait = getattr(m, "wait_compiled", None)  # of the weights are shared too
        if wait is not None:
            wait(native=False)
    with _LOCK:
        arrays = list(_arrays_of(models))
        maps = _Maps.read()
        report = SharedWeights()
        ranges: list[tuple[int, int]] = []
        for lo, hi in _merge(_extent(a) for a in arrays):
            if maps.file_backed(lo, hi):
                report.file_bytes += hi - lo
            elif hi - lo < min_bytes:
                report.private_bytes += hi - lo
            else:
                a0, a1 = -(-lo // PAGE) * PAGE, (hi // PAGE) * PAGE
                report.private_bytes += (hi - lo) - max(0, a1 - a0)
                if a1 > a0:
                    ranges.append((a0, a1))
        if ranges:
            _remap(ranges)
            _PINNED.extend(arrays)
            report.regions = ranges
            report.shared_bytes = sum(b - a for a, b in ranges)
            report.arrays = sum(1 for a in arrays if _inside(_extent(a), ranges))
        _trim_heap()
        return report


def describe_lines(graph: Any) -> list[str]:
    """One line for ``Model.describe()``: the graph's constants of at least
    ``MIN_SHARED_BYTES`` and how their memory is held -- memory-mapped from external data,
    in the shared-weights cache (``share_weights``), or private to this process."""
    consts = [
        (v.name, v.const)
        for v in graph.constants
        if isinstance(v.const, np.ndarray) and v.const.nbytes >= MIN_SHARED_BYTES
    ]
    if not consts:
        return []
    total = sum(int(a.nbytes) for _, a in consts)
    if not sys.platform.startswith("linux"):
        return [f"  weights: {_size(total)} in {len(consts)} constants (sharing: Linux only)"]
    maps = _Maps.read()
    kinds: dict[str, list[tuple[str, int]]] = {"external data": [], "shared cache": []}
    private: list[tuple[str, int]] = []
    for name, a in consts:
        lo, hi = _extent(a)
        path = maps.path_of(lo, hi)
        if path is None:
            private.append((name, int(a.nbytes)))
        else:
            kinds["shared cache" if CACHE_PREFIX in path else "external data"].append(
                (name, int(a.nbytes))
            )
    parts = [f"{what}: {_names(items)}" for what, items in kinds.items() if items]
    shared = sum(n for items in kinds.values() for _, n in items)
    line = f"  weights: {_size(total)} in {len(consts)} constants; shared across forks: "
    line += f"{_size(shared)} ({'; '.join(parts)})" if parts else "none"
    if private:
        line += f"; private: {_names(private)}"
    return [line]


def _names(items: list[tuple[str, int]]) -> str:
    shown = ", ".join(f"{n!r}" for n, _ in items[:8])
    more = f" and {len(items) - 8} more" if len(items) > 8 else ""
    return f"{len(items)} ({_size(sum(s for _, s in items))}): {shown}{more}"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


# -- finding a model's arrays ----------------------------------------------------------------
#: Objects the walk does not enter: weak proxies (``isinstance`` on one whose referent is
#: gone raises ReferenceError; a weak reference owns nothing anyway).
_NOT_ENTERED = frozenset({weakref.ProxyType, weakref.CallableProxyType, weakref.ReferenceType})


def _arrays_of(roots: Iterable[Any]) -> Iterator[np.ndarray]:
    """Every read-only contiguous ndarray reachable from ``roots`` (attributes, containers,
    closure cells and defaults of functions, bound methods, array bases), without entering
    modules, classes, a function's globals, weak references or numba's compiled functions.
    Constants are imported read-only; writeable arrays (plan arenas, scratch) are written by
    calls, so sharing them would buy nothing."""
    seen: set[int] = set()
    stack = list(roots)
    while stack and len(seen) < MAX_WALK:
        o = stack.pop()
        if type(o) in _NOT_ENTERED or type(o).__module__.startswith("numba"):
            continue  # a weak proxy (its referent may be gone), compiled code
        if id(o) in seen or isinstance(o, (types.ModuleType, type, str, bytes, int, float)):
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            if not o.flags.writeable and (o.flags.c_contiguous or o.flags.f_contiguous):
                yield o
            if o.base is not None:
                stack.append(o.base)
            continue
        if isinstance(o, types.FunctionType):
            stack.extend(c.cell_contents for c in o.__closure__ or () if _filled(c))
            stack.extend(o.__defaults__ or ())
            stack.extend((o.__kwdefaults__ or {}).values())
            continue
        if isinstance(o, dict) and ("__builtins__" in o or "__loader__" in o):
            continue  # a module's globals
        stack.extend(gc.get_referents(o))


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _extent(a: np.ndarray) -> tuple[int, int]:
    lo = int(a.__array_interface__["data"][0])
    return lo, lo + int(a.nbytes)


def _merge(extents: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(e for e in extents if e[1] > e[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _inside(extent: tuple[int, int], ranges: list[tuple[int, int]]) -> bool:
    lo, hi = extent
    return any(a < hi and lo < b for a, b in ranges)


class _Maps:
    """This process's mappings (``/proc/self/maps``), sorted by start address."""

    def __init__(self, rows: list[tuple[int, int, int, str]]) -> None:
        self.rows = rows
        self.starts = [r[0] for r in rows]

    @classmethod
    def read(cls) -> _Maps:
        rows = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                path = parts[5].strip() if len(parts) > 5 else ""
                rows.append((lo, hi, int(parts[4]), path))
        rows.sort()
        return cls(rows)

    def path_of(self, lo: int, hi: int) -> str | None:
        """The file every whole page of [lo, hi) is mapped from (None: some page is
        anonymous, or the range holds no whole page and its first byte is anonymous)."""
        a0, a1 = -(-lo // PAGE) * PAGE, (hi // PAGE) * PAGE
        if a1 <= a0:
            a0, a1 = lo, lo + 1
        path = None
        at = a0
        while at < a1:
            i = bisect.bisect_right(self.starts, at) - 1
            if i < 0 or self.rows[i][1] <= at or self.rows[i][2] == 0:
                return None
            path = self.rows[i][3]
            at = self.rows[i][1]
        return path

    def file_backed(self, lo: int, hi: int) -> bool:
        return self.path_of(lo, hi) is not None


# -- the cache file and the remap ----------------------------------------------------------
def _cache_parent() -> str | None:
    shm = "/dev/shm"  # tmpfs: the cache costs memory once, never disk
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _remap(ranges: list[tuple[int, int]]) -> None:
    """Write the pages of ``ranges`` to a private cache file, check it, map it over them."""
    from .concurrency.cachedir import check_dir

    d = tempfile.mkdtemp(prefix=CACHE_PREFIX, dir=_cache_parent())  # 0700, a fresh name
    path = os.path.join(d, "weights.bin")
    try:
        check_dir(d)  # ours, 0700, under a parent nobody else may rename it in
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            digests = [_write(fd, lo, hi) for lo, hi in ranges]
            offset = 0
            checked = []
            for (lo, hi), digest in zip(ranges, digests):
                _verify(fd, offset, hi - lo, digest)
                checked.append((lo, hi, offset))
                offset += hi - lo
            for lo, hi, off in checked:
                _map_fixed(fd, lo, hi - lo, off)
        finally:
            os.close(fd)
    finally:
        if os.path.lexists(path):
            os.unlink(path)
        os.rmdir(d)


def _write(fd: int, lo: int, hi: int) -> bytes:
    view = memoryview((ctypes.c_char * (hi - lo)).from_address(lo)).cast("B")
    h = hashlib.sha256()
    step = 1 << 24
    for at in range(0, hi - lo, step):
        chunk = view[at : at + step]
        h.update(chunk)
        done = 0
        while done < len(chunk):
            done += os.write(fd, chunk[done:])
    return h.digest()


def _verify(fd: int, offset: int, length: int, digest: bytes) -> None:
    """The file region must hold exactly the bytes we hashed from memory: a file is never
    mapped over the weights on trust."""
    with mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ, offset=offset) as m:
        if hashlib.sha256(m).digest() != digest:
            raise OSError(f"shared-weights cache: the file changed after it was written ({offset})")


_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_long]  # fmt: skip
    return _libc


def _trim_heap() -> None:
    """Give the allocator's free pages back to the kernel (glibc ``malloc_trim``): what
    loading freed (a parsed model's protobuf, its byte strings) would otherwise be resident
    in the parent and, shared copy-on-write, in every child's PSS. The remapped arrays are
    pinned, never free, so never trimmed."""
    trim = getattr(_c(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _map_fixed(fd: int, addr: int, length: int, offset: int) -> None:
    prot = mmap.PROT_READ | mmap.PROT_WRITE  # as the anonymous memory was; writes stay private
    flags = mmap.MAP_PRIVATE | 0x10  # MAP_FIXED
    got = _c().mmap(addr, length, prot, flags, fd, offset)
    if got != addr:
        err = ctypes.get_errno()
        raise OSError(err, f"shared-weights cache: mmap MAP_FIXED failed: {os.strerror(err)}")
