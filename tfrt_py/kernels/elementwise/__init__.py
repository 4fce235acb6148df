"""Kernels: the elementwise family.

Unary math (``elementwise_unary``), activations (``elementwise_activation``), binary,
variadic, Clip and Where (``elementwise_binary``), Cast and CastLike
(``elementwise_cast``); Erf without SciPy lives in ``elementwise_erf``.

All of them follow the contract in ``base.py``: the builder settles attributes, opset
differences and constant inputs at load; the compute function is NumPy calls only, keeps
ONNX's output dtype, and takes ``out=`` (single output, registered ``supports_out``).
"""

from __future__ import annotations

from ..registry import KernelRegistry
from .activation import register_activations
from .binary import register_binary
from .cast import register_cast
from .unary import register_unary


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels."""
    register_unary(registry)
    register_activations(registry)
    register_binary(registry)
    register_cast(registry)
