"""Kernels: ops that rearrange, describe or generate tensors: Reshape...Tile (``layout``),
ConstantOfShape...SpaceToDepth (``gen``), Pad and CenterCropPad (``pad``).
"""

from __future__ import annotations

from ..registry import KernelRegistry
from . import gen, layout, pad

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels."""
    layout.register_kernels(registry)
    gen.register_kernels(registry)
    pad.register_kernels(registry)
