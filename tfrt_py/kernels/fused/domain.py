"""The private domain of the compiler's fused ops, and the form of a fused elementwise step.

Imported by the fusion passes (which make the nodes), by the kernels here (which run them)
and by the native tier (which lowers them); it imports nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DOMAIN", "Step"]

DOMAIN = "tfrt_py.fused"

#: ``(op_type, opset, attrs, refs)``: an ONNX elementwise op run by its own kernel, whose
#: operands ``refs`` are ``-1`` for the running result or ``i`` for the fused node's input
#: ``i`` (``ElementwiseChain``'s steps, ``Linear``'s activation).
Step = tuple[str, int, dict[str, Any], tuple[int, ...]]
