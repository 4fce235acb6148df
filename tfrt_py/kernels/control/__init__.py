"""Kernels: control flow (If, Loop, Scan in ``flow``) and sequences and optionals
(``sequence``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import flow, sequence

    flow.register_kernels(registry)
    sequence.register_kernels(registry)
