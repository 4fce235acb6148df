"""Kernels by family, a registry keyed by (domain, op type, opset range).

See ``base.py`` for the contract every kernel keeps. Each family subpackage exposes
``register_kernels(registry)``; ``FAMILIES`` lists them in registration order.
"""

from __future__ import annotations

from .base import REQUIRED as REQUIRED
from .base import ComputeFn as ComputeFn
from .base import Cost as Cost
from .base import KernelContext as KernelContext
from .base import KernelFlags as KernelFlags
from .base import SubgraphFn as SubgraphFn
from .registry import KernelDef as KernelDef
from .registry import KernelRegistry as KernelRegistry
from .registry import default_registry as default_registry

#: Kernel family modules, registered in this order by ``default_registry()``. Imported on
#: first use, so ``import tfrt_py`` stays cheap.
FAMILIES = (
    "elementwise",
    "linalg",
    "nn",
    "shape",
    "indexing",
    "reduce",
    "control",
    "ml",
    "image",
    "misc",
)

__all__ = [
    "FAMILIES",
    "REQUIRED",
    "ComputeFn",
    "Cost",
    "KernelContext",
    "KernelDef",
    "KernelFlags",
    "KernelRegistry",
    "SubgraphFn",
    "default_registry",
]
