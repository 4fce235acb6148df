"""The native tier: a prepared graph lowered to one numba-compiled function.

Three rooms: ``lower/`` (graph -> module source; one registry of op lowerings),
``kernels/`` (the hand-written numba kernels generated code calls), ``runtime/`` (compile,
disk cache, the tier's Executor, the background worker and the compile server). numba is
imported only when something is compiled.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .lower.graph import Declined, blockers
    from .runtime.availability import NativeUnavailable, available
    from .runtime.compile import CACHE_ENV

# (the lowering function is ``lower.graph.lower``: the name ``lower`` here is its package)
__all__ = ["CACHE_ENV", "Declined", "NativeUnavailable", "available", "blockers"]

#: Where each name lives: imported on first use, so ``import tfrt_py`` and a load that
#: lowers nothing do not import the lowering (~40 ms).
_HOMES = {
    "Declined": ".lower.graph",
    "blockers": ".lower.graph",
    "CACHE_ENV": ".runtime.compile",
    "NativeUnavailable": ".runtime.availability",
    "available": ".runtime.availability",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
