"""Kernels: ops of no larger family: signal processing (``signal``) and strings
(``strings``).
"""

from __future__ import annotations

from ..registry import KernelRegistry
from . import signal, strings

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels."""
    signal.register_kernels(registry)
    strings.register_kernels(registry)
