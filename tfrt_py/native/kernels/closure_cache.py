"""numba's disk cache for kernels a factory builds (closures over other compiled functions).

numba keys a closure's cache entries by its cells pickled, and a cell holding a dispatcher
pickles with that dispatcher's per-process uuid: such a kernel never finds its cache, so
every process compiled it again, and so did every native module that calls it (a forest's
walks, 5-6 s a model). ``cached(dispatcher)`` keys the entries by what the cells are: a
compiled function by its module, qualified name, bytecode, constants and names and,
likewise, its own cells; a number, string or bool by its type and repr. A cell of any
other kind keeps numba's own key. The rest is numba's ``FunctionCache`` (files beside the
source, invalidated when that file changes), as ``cache=True`` gives a plain function.

numba's stamp is the function's own file; a kernel's cached machine code also holds the
kernels of other files it calls (``trees`` calls ``post``, ``svm`` calls ``fastmath``).
``stamp_with_siblings(globals())``, at the end of each kernel module, joins the stamps of
every file of this package to its dispatchers' (as ``kernels.lib.jit`` does for a kernel's
helpers, through ``jit.join_stamps``), so a change to any of them recompiles: a checkout
never runs stale code. Import-time only; no state.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
from typing import Any

from ...kernels.lib.jit import join_stamps

__all__ = ["cached", "stamp_with", "stamp_with_siblings"]

_PLAIN = (bool, int, float, str, bytes, type(None))


def cached(dispatcher: Any) -> Any:
    """``dispatcher`` (a ``numba.njit(cache=False)`` closure) with a disk cache whose key
    is stable across processes; unchanged where numba's internals differ from 0.62-0.68's."""
    if (cache_class := _stable_cells_cache()) is not None and hasattr(dispatcher, "_cache"):
        dispatcher._cache = cache_class(dispatcher.py_func)
    return dispatcher


@functools.cache
def _stable_cells_cache() -> Any:
    """numba's ``FunctionCache`` keyed by ``_describe``; None where numba has none."""
    try:
        from numba.core.caching import FunctionCache
    except ImportError:  # pragma: no cover - numba reorganized: compile per process
        return None

    class _StableCellsCache(FunctionCache):
        def _index_key(self, sig: Any, codegen: Any) -> Any:
            cells = _describe(self._py_func)
            if cells is None:
                return super()._index_key(sig, codegen)
            code = hashlib.sha256(self._py_func.__code__.co_code).hexdigest()
            return (sig, codegen.magic_tuple(), (code, hashlib.sha256(cells).hexdigest()))

    return _StableCellsCache


def _describe(fn: Any) -> bytes | None:
    """A process-independent description of ``fn``'s closure cells; None where a cell is
    of a kind it cannot describe (numba's own key then)."""
    parts = []
    for cell in fn.__closure__ or ():
        value = cell.cell_contents
        py_func = getattr(value, "py_func", None)
        if py_func is not None:
            inner = _describe(py_func)
            if inner is None:
                return None
            code = py_func.__code__
            name = f"{py_func.__module__}.{py_func.__qualname__}"
            parts += [b"f", name.encode(), code.co_code, repr(code.co_consts).encode(),
                      repr(code.co_names).encode(), inner]  # fmt: skip
        elif isinstance(value, _PLAIN):
            parts += [type(value).__name__.encode(), repr(value).encode()]
        else:
            return None
    return b"".join(len(p).to_bytes(8, "little") + p for p in parts)


def stamp_with(namespace: dict[str, Any], files: list[str]) -> None:
    """``jit.join_stamps(d, files)`` for every numba dispatcher ``d`` in ``namespace``."""
    for value in list(namespace.values()):
        if hasattr(value, "py_func"):
            join_stamps(value, files)


def stamp_with_siblings(namespace: dict[str, Any]) -> None:
    """``stamp_with`` every ``.py`` file of ``native/kernels``."""
    stamp_with(namespace, glob.glob(os.path.join(os.path.dirname(__file__), "*.py")))
