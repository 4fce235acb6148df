"""Kernels: control flow (If, Loop, Scan in ``flow``) and sequences and optionals
(``sequence``).
"""

from __future__ import annotations

from ..registry import KernelRegistry
from . import flow, sequence

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels."""
    flow.register_kernels(registry)
    sequence.register_kernels(registry)
