"""The built-in kernel families and the default registry built from them.

A family is a subpackage of ``tfrt_py.kernels`` whose ``register_kernels(registry)`` adds
its kernels explicitly (TFRT's static registration, without import-time side effects), by
calling its modules' ``register_kernels``. ``default_registry()`` adds every kernel module
of every family to one registry *lazily* (``KernelRegistry.add_lazy``): the generated
index ``module_ops.MODULE_OPS`` says which ops each module serves, and a module is imported
and registered the first time one of its ops is looked up. So ``load()`` of an MLP imports
the Gemm and elementwise kernels, not the convolution stack. No two modules serve the same
op (a test checks), so the order they load in changes nothing. ``fused`` (the compiler's
fused ops) is the one family that composes others: its builders look the other families'
kernels up in the registry they are registered into.

Layering: this module sits above the families (it imports them, on first use), the
families sit above ``registry.py`` and ``base.py`` (they import those), so no import goes
back up.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable

from .module_ops import MODULE_OPS
from .registry import KernelRegistry, Register

__all__ = ["FAMILIES", "add_family", "default_registry"]

#: Every built-in family, in the order the index lists them.
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
    "contrib",
    "fused",
)

_DEFAULT: KernelRegistry | None = None
_LOCK = threading.Lock()


def _loader(module: str) -> Callable[[], Register]:
    def load() -> Register:
        register: Register = importlib.import_module(f"{__package__}.{module}").register_kernels
        return register

    return load


def add_family(registry: KernelRegistry, family: str) -> None:
    """Add built-in ``family``'s modules to ``registry`` lazily. What ``registry`` already
    holds of them is dropped first, so their builders bind to ``registry`` when next used
    (``custom.with_custom`` does this for ``fused`` in a copy with custom kernels)."""
    for module, ops in MODULE_OPS.items():
        if module.partition(".")[0] == family:
            registry.reset_lazy(module, ops, _loader(module))


def default_registry() -> KernelRegistry:
    """The registry of every built-in kernel family, built once (thread-safe; kernel
    modules load on first use). Callers that add kernels take a ``copy()`` first; this one
    is shared and never given other kernels."""
    global _DEFAULT
    if _DEFAULT is None:
        with _LOCK:
            if _DEFAULT is None:
                reg = KernelRegistry()
                for module, ops in MODULE_OPS.items():
                    reg.add_lazy(module, ops, _loader(module))
                _DEFAULT = reg
    return _DEFAULT
