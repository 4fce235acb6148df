"""Kernels by family, a registry keyed by (domain, op type, opset range).

See ``base.py`` for the contract every kernel keeps and ``docs/kernels.md`` for how to add
one. Each family subpackage (``elementwise``, ``linalg``, ``nn``, ``shape``, ``indexing``,
``reduce``, ``control``, ``ml``, ``image``, ``misc``, ``contrib``, and ``fused``: the
compiler's fused ops) exposes
``register_kernels(registry)``; ``families.default_registry()`` calls them all, in one list,
on first use.
"""

from __future__ import annotations

from .base import REQUIRED as REQUIRED
from .base import ComputeFn as ComputeFn
from .base import Cost as Cost
from .base import Inline as Inline
from .base import InlineFn as InlineFn
from .base import KernelContext as KernelContext
from .base import KernelFlags as KernelFlags
from .base import SubgraphFn as SubgraphFn
from .families import default_registry as default_registry
from .registry import KernelDef as KernelDef
from .registry import KernelRegistry as KernelRegistry

__all__ = [
    "REQUIRED",
    "ComputeFn",
    "Cost",
    "Inline",
    "InlineFn",
    "KernelContext",
    "KernelDef",
    "KernelFlags",
    "KernelRegistry",
    "SubgraphFn",
    "default_registry",
]
