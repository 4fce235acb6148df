"""Kernels: reductions (``reductions``), ArgMax/ArgMin/TopK/CumSum (``index``),
Softmax/LogSoftmax/Hardmax (``softmax``) and the losses (``loss``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import index, loss, reductions, softmax

    reductions.register_kernels(registry)
    index.register_kernels(registry)
    softmax.register_kernels(registry)
    loss.register_kernels(registry)
