"""Kernels: ops of no larger family: signal processing (``signal``) and strings
(``strings``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import signal, strings

    signal.register_kernels(registry)
    strings.register_kernels(registry)
