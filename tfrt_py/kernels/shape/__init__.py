"""Kernels: ops that rearrange, describe or generate tensors: Reshape...Tile (``layout``),
ConstantOfShape...SpaceToDepth (``gen``), Pad and CenterCropPad (``pad``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import gen, layout, pad

    layout.register_kernels(registry)
    gen.register_kernels(registry)
    pad.register_kernels(registry)
