"""The built-in kernel families and the default registry built from them.

A family is a subpackage of ``tfrt_py.kernels`` whose ``register_kernels(registry)`` adds
its kernels explicitly (TFRT's static registration, without import-time side effects).
``default_registry()`` calls every family's ``register_kernels``, in the order of
``_families()``, once per process. ``fused`` (the compiler's fused ops) comes last: its
builders look the other families' elementwise kernels up in the registry they are
registered into.

Layering: this module sits above the families (it imports them), the families sit above
``registry.py`` and ``base.py`` (they import those), so no import goes back up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .registry import KernelRegistry

__all__ = ["default_registry"]

_DEFAULT: KernelRegistry | None = None
_LOCK = threading.Lock()


def _families() -> tuple[Callable[[KernelRegistry], None], ...]:
    """Every built-in family's ``register_kernels``, in registration order."""
    # Imported here, on first use, so that ``import tfrt_py`` does not import every family.
    from . import (
        contrib,
        control,
        elementwise,
        fused,
        image,
        indexing,
        linalg,
        misc,
        ml,
        nn,
        reduce,
        shape,
    )

    return (
        elementwise.register_kernels,
        linalg.register_kernels,
        nn.register_kernels,
        shape.register_kernels,
        indexing.register_kernels,
        reduce.register_kernels,
        control.register_kernels,
        ml.register_kernels,
        image.register_kernels,
        misc.register_kernels,
        contrib.register_kernels,
        fused.register_kernels,
    )


def default_registry() -> KernelRegistry:
    """The registry of every built-in kernel family, built once (thread-safe). Callers that
    add kernels take a ``copy()`` first; this one is shared and never mutated."""
    global _DEFAULT
    if _DEFAULT is None:
        with _LOCK:
            if _DEFAULT is None:
                reg = KernelRegistry()
                for register in _families():
                    register(reg)
                _DEFAULT = reg
    return _DEFAULT
