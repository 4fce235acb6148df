"""Compile a lowered module with numba, cached on disk.

The generated source is written once to ``<cache dir>/tfrt_native_<hash>.py`` (the hash
covers the source, the numba and llvmlite versions, the Python version and the host CPU)
and imported from there; its ``@njit(..., cache=True)`` keeps the machine code in
``<cache dir>/__pycache__``, so a second load of the same model (or of any model with the
same structure: weights are arguments, not code) skips LLVM. The cache dir is
``$TFRT_PY_CACHE_DIR`` or ``~/.cache/tfrt_py/native``.

numba is imported lazily and guarded: ``available()`` never imports it, ``compile_lowered``
raises NativeUnavailable when it cannot import. Thread-safe: files are written
atomically (temp file + rename) and numba serializes its own compilation.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import TfrtError
from .lower import Lowered

__all__ = [
    "CACHE_ENV",
    "Compiled",
    "NativeUnavailable",
    "available",
    "cache_dir",
    "compile_lowered",
]

CACHE_ENV = "TFRT_PY_CACHE_DIR"


class NativeUnavailable(TfrtError, RuntimeError):
    """numba cannot be imported here, so the native tier cannot run."""


@dataclass(frozen=True)
class Compiled:
    """The compiled entry point and how it was obtained."""

    fn: Callable[..., Any]
    path: str
    cache_hit: bool
    seconds: float


def available() -> bool:
    """Whether numba looks importable (does not import it)."""
    return importlib.util.find_spec("numba") is not None


def cache_dir() -> str:
    """The directory for generated modules and numba's cache (created on demand)."""
    d = os.environ.get(CACHE_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "tfrt_py", "native"
    )
    os.makedirs(d, exist_ok=True)
    return d


def _host_key() -> str:
    import llvmlite
    import numba
    from llvmlite import binding

    cpu = binding.get_host_cpu_name() + binding.get_host_cpu_features().flatten()
    return f"{numba.__version__}|{llvmlite.__version__}|{sys.version}|{platform.machine()}|{cpu}"


def compile_lowered(lowered: Lowered) -> Compiled:
    """Import (and so compile, or load from numba's cache) the lowered module."""
    t0 = time.perf_counter()
    try:
        key = hashlib.sha256((lowered.source + _host_key()).encode()).hexdigest()[:32]
    except ImportError as e:
        raise NativeUnavailable(f"numba cannot be imported: {e}") from e
    d = cache_dir()
    name = f"tfrt_native_{key}"
    path = os.path.join(d, name + ".py")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(lowered.source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # numba's cache finds the function's globals by importing its module by name.
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    fn = module.run
    hit = bool(sum(fn.stats.cache_hits.values()))
    return Compiled(fn, path, hit, time.perf_counter() - t0)
