"""Compile a lowered module with numba, cached on disk, trusting no file there.

The generated source is kept at ``<cache dir>/tfrt_native_<key>.py``, ``key`` a SHA-256 of
the source and the host (numba, llvmlite and Python versions, CPU). Its ``@njit(...,
cache=True)`` keeps the machine code in ``<cache dir>/__pycache__``, so a second load of
the same model (or of any model with the same structure: weights are arguments, not code)
skips LLVM. The cache dir is ``$TFRT_PY_CACHE_DIR`` or ``~/.cache/tfrt_py/native``.

Trust (model files and cache dirs may be hostile; docs/security.md):

* The code that runs is always the source in memory (``Lowered.source``): it is compiled
  with ``compile(source, path)`` and executed in a fresh module; the file on disk is never
  imported. The file exists for numba's cache, which keys its index by the file's
  content; before use its content is compared with the source, and a file that differs
  (tampered, truncated, a symlink) is replaced atomically, and numba's index and data
  files for that module are deleted unread (they are pickles: loading one runs code),
  in ``__pycache__`` and, with ``$NUMBA_CACHE_DIR`` set, where numba keeps them there.
* The cache dir (and ``$NUMBA_CACHE_DIR`` when set) must pass ``cachedir.check_dir``
  (created 0700, owned by us, nobody else can write it or swap it), else
  ``UnsafeCacheDir``: then nobody but its owner can plant a module or a numba pickle
  there. ``executor="auto"`` stays on the sync interpreter and ``describe()`` says why.

numba is imported lazily and guarded: ``available()`` never imports it, ``compile_lowered``
raises NativeUnavailable when it cannot import. Thread-safe: files are written
atomically (temp file + rename) and numba serializes its own compilation.
"""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import stat
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...concurrency import numba_target
from ...concurrency.cachedir import CACHE_ENV, UnsafeCacheDir, cache_dir, check_dir, make_private
from ...records import record
from .availability import NativeUnavailable, available

if TYPE_CHECKING:
    from ..lower.graph import Lowered

__all__ = [
    "CACHE_ENV",
    "Compiled",
    "NativeUnavailable",
    "UnsafeCacheDir",
    "available",
    "cache_dir",
    "check_dir",
    "compile_lowered",
    "compile_source",
]


@record(frozen=True)
class Compiled:
    """The compiled entry point and how it was obtained."""

    fn: Callable[..., Any]
    path: str
    cache_hit: bool
    seconds: float
    #: Rows mode: ``run_into(inputs, outputs, params, lo, hi)``, rows lo:hi (else None).
    fn_into: Callable[..., Any] | None = None


def _host_key() -> str:
    """The host's part of a generated module's name: versions, CPU and the features
    numba compiles for (``numba_target``, which sets them before anything compiles; the
    compile server's child is given this process's)."""
    import llvmlite
    from llvmlite import binding

    numba = numba_target.import_numba()
    cpu = binding.get_host_cpu_name() + numba_target.cpu_features()
    return f"{numba.__version__}|{llvmlite.__version__}|{sys.version}|{platform.machine()}|{cpu}"


def _numba_cache_dir() -> None:
    """numba keeps its index elsewhere when ``$NUMBA_CACHE_DIR`` is set: check that too."""
    from numba.core import config

    numba_dir = str(getattr(config, "CACHE_DIR", "") or "")
    if numba_dir:
        make_private(numba_dir)
        check_dir(numba_dir)


def _same_file(path: str, data: bytes) -> bool:
    """Whether ``path`` is a regular file (not a symlink) holding exactly ``data``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return False
        return f.read(len(data) + 1) == data


def _numba_index_dirs(path: str) -> list[str]:
    """Where numba keeps the index and data files of the module at ``path``: its
    ``__pycache__``, and with ``$NUMBA_CACHE_DIR`` set the directory numba names for the
    module's directory there (numba's own ``get_suitable_cache_subpath``)."""
    dirs = [os.path.join(os.path.dirname(path), "__pycache__")]
    from numba.core import caching, config

    numba_dir = str(getattr(config, "CACHE_DIR", "") or "")
    if numba_dir:
        sub = caching._CacheLocator.get_suitable_cache_subpath(path)
        dirs.append(os.path.join(numba_dir, sub))
    return dirs


def _write_verified(d: str, name: str, source: str) -> str:
    """``<d>/<name>.py`` holding exactly ``source``: rewritten (and numba's files for it
    deleted unread) when it is missing or differs."""
    path = os.path.join(d, name + ".py")
    data = source.encode()
    if _same_file(path, data):
        return path
    for where in _numba_index_dirs(path):
        for stale in glob.glob(os.path.join(glob.escape(where), glob.escape(name) + ".*")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def compile_lowered(lowered: Lowered) -> Compiled:
    """Compile (or load from numba's cache) the lowered module; the code executed is
    ``lowered.source`` itself, never a file's content. Raises NativeUnavailable (numba
    missing), UnsafeCacheDir (a cache dir others could write), numba's errors."""
    return compile_source(lowered.source)


def compile_source(source: str) -> Compiled:
    """``compile_lowered`` for a module's source (the compile server's child calls it).
    What compiles is the source with its repeated layers moved into one function
    (``lower.outline``: numba compiled each copy anew) and its ``run`` cut into parts
    (``lower.split``: numba's front end grows faster than linearly with a function),
    keyed and cached as such."""
    from ..lower.outline import outline_repeats
    from ..lower.split import split_run

    source = split_run(outline_repeats(source))
    t0 = time.perf_counter()
    try:
        host = _host_key()
    except ImportError as e:
        raise NativeUnavailable(f"numba cannot be imported: {e}") from e
    d = cache_dir()
    _numba_cache_dir()
    import hashlib  # here: `import tfrt_py` does not pay for it

    key = hashlib.sha256((source + "\0" + host).encode()).hexdigest()[:32]
    name = f"tfrt_native_{key}"
    path = _write_verified(d, name, source)
    code = compile(source, path, "exec", dont_inherit=True)
    module = types.ModuleType(name)
    module.__file__ = path
    # numba's cache finds the function's globals by importing its module by name.
    sys.modules.setdefault(name, module)
    exec(code, module.__dict__)
    fn = module.run
    hit = bool(sum(fn.stats.cache_hits.values()))
    into = getattr(module, "run_into", None)
    return Compiled(fn, path, hit, time.perf_counter() - t0, into)
