"""The native tier: a prepared graph lowered to one numba-compiled function.

Three rooms: ``lower/`` (graph -> module source; one registry of op lowerings),
``kernels/`` (the hand-written numba kernels generated code calls), ``runtime/`` (compile,
disk cache, the tier's Executor, the background worker and the compile server). numba is
imported only when something is compiled.
"""

from __future__ import annotations

from .lower.graph import Declined, blockers, lower
from .runtime.compile import CACHE_ENV, NativeUnavailable, available

__all__ = ["CACHE_ENV", "Declined", "NativeUnavailable", "available", "blockers", "lower"]
