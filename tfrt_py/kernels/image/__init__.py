"""Kernels: Resize and Upsample (``resize``, tables in ``resize_plan``) and the vision ops
(``vision``: NonMaxSuppression, RoiAlign, GridSample, AffineGrid).
"""

from __future__ import annotations

from ..registry import KernelRegistry
from . import resize, vision

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels."""
    resize.register_kernels(registry)
    vision.register_kernels(registry)
