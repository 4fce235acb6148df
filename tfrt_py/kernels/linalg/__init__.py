"""Kernels: MatMul, Gemm, Det and Einsum (``matmul``, ``einsum``), the integer matmuls
(``matmul_integer``) and QuantizeLinear/DequantizeLinear (``quantize``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import einsum, matmul, matmul_integer, quantize

    matmul.register_kernels(registry)
    einsum.register_kernels(registry)
    matmul_integer.register_kernels(registry)
    quantize.register_kernels(registry)
