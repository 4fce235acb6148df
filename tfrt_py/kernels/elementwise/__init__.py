"""Kernels: the elementwise family.

Unary math (``unary``), activations (``activation``), binary, variadic, Clip and Where
(``binary``), Cast and CastLike (``cast``); Erf without SciPy lives in ``erf``.

All of them follow the contract in ``base.py``: the builder settles attributes, opset
differences and constant inputs at load; the compute function is NumPy calls only, keeps
ONNX's output dtype, and takes ``out=`` (single output, registered ``supports_out``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import activation, binary, cast, unary

    unary.register_kernels(registry)
    activation.register_kernels(registry)
    binary.register_kernels(registry)
    cast.register_kernels(registry)
