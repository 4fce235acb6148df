"""The native tier: a prepared graph lowered to one numba-compiled function.

``lower.py`` (graph -> module source, per-op table in ``ops.py``), ``compile.py`` (numba,
disk cache), ``tier.py`` (background compilation and the switch-over from the sync
interpreter). numba is imported only when something is compiled.
"""

from __future__ import annotations

from .compile import CACHE_ENV, NativeUnavailable, available
from .lower import Declined, blockers, lower

__all__ = ["CACHE_ENV", "Declined", "NativeUnavailable", "available", "blockers", "lower"]
