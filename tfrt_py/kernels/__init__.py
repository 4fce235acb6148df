"""Kernels by family, a registry keyed by (domain, op type, opset range).

See ``base.py`` for the contract every kernel keeps. Each family module exposes
``register_kernels(registry)``; ``FAMILIES`` lists them in registration order.
"""

from __future__ import annotations

from . import (
    control,
    conv,
    elementwise,
    indexing,
    linalg,
    ml,
    norm,
    pool,
    quant,
    reduce,
    resize,
    rnn,
    sequence,
    shape,
    signal,
    strings,
    transformer,
)
from .base import REQUIRED as REQUIRED
from .base import ComputeFn as ComputeFn
from .base import Cost as Cost
from .base import KernelContext as KernelContext
from .base import KernelFlags as KernelFlags
from .base import SubgraphFn as SubgraphFn
from .registry import KernelDef as KernelDef
from .registry import KernelRegistry as KernelRegistry
from .registry import default_registry as default_registry

FAMILIES = (
    elementwise.register_kernels,
    linalg.register_kernels,
    conv.register_kernels,
    pool.register_kernels,
    norm.register_kernels,
    shape.register_kernels,
    indexing.register_kernels,
    reduce.register_kernels,
    rnn.register_kernels,
    control.register_kernels,
    sequence.register_kernels,
    ml.register_kernels,
    resize.register_kernels,
    transformer.register_kernels,
    quant.register_kernels,
    signal.register_kernels,
    strings.register_kernels,
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
