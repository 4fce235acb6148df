"""Kernels: neural-network layers: convolutions (``conv``, ``conv_transpose``,
``conv_deform``), pooling (``pool``), normalizations (``norm``, ``norm_group``), recurrent
layers (``rnn``), Attention (``attention``) and the other transformer ops (``transformer``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import (
        attention,
        conv,
        conv_deform,
        conv_transpose,
        norm,
        norm_group,
        pool,
        pool_nhwc,
        rnn,
        transformer,
    )

    conv.register_kernels(registry)
    conv_transpose.register_kernels(registry)
    conv_deform.register_kernels(registry)
    pool.register_kernels(registry)
    pool_nhwc.register_kernels(registry)
    norm.register_kernels(registry)
    norm_group.register_kernels(registry)
    rnn.register_kernels(registry)
    attention.register_kernels(registry)
    transformer.register_kernels(registry)
