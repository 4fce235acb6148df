"""Kernels: Resize and Upsample (``resize``, tables in ``resize_plan``) and the vision ops
(``vision``: NonMaxSuppression, RoiAlign, GridSample, AffineGrid; NonMaxSuppression's
compiled grid in ``nms_jit``, its NumPy paths in ``nms_numpy``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import resize, vision

    resize.register_kernels(registry)
    vision.register_kernels(registry)
