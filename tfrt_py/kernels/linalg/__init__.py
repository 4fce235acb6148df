"""Kernels: MatMul, Gemm, Det and Einsum (``matmul``, ``einsum``), the integer matmuls
(``matmul_integer``) and QuantizeLinear/DequantizeLinear (``quantize``).
"""

from __future__ import annotations

from ..registry import KernelRegistry
from . import einsum, matmul, matmul_integer, quantize

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels."""
    matmul.register_kernels(registry)
    einsum.register_kernels(registry)
    matmul_integer.register_kernels(registry)
    quantize.register_kernels(registry)
