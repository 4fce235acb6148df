"""Kernels: selecting elements by position: Slice, Gather*, Compress, NonZero (``gather``),
the scatters (``scatter``), OneHot, Unique, ReverseSequence, Trilu (``misc``).
"""

from __future__ import annotations

from ..registry import KernelRegistry
from . import gather, misc, scatter

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels."""
    gather.register_kernels(registry)
    scatter.register_kernels(registry)
    misc.register_kernels(registry)
