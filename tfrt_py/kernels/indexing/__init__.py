"""Kernels: selecting elements by position: Slice, Gather*, Compress, NonZero (``gather``),
the scatters (``scatter``), OneHot, Unique, ReverseSequence, Trilu (``misc``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import gather, misc, scatter

    gather.register_kernels(registry)
    scatter.register_kernels(registry)
    misc.register_kernels(registry)
