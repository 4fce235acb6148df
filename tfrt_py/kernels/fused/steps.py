"""The steps of a fused elementwise op: each built once at load from the registry's own
kernel for that ONNX op (so the numbers are exactly the unfused ones), and the statements
the sync interpreter's generated code runs for one (``_step_code``).

Each step kernel is built from a synthetic node whose inputs carry the real Values, so
constant operands are seen at load, as in the unfused graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import Node, TensorType, Value
from ..base import KernelContext
from ..registry import KernelRegistry
from .domain import Step

__all__ = ["build_step", "step_code"]

#: Unary steps whose float kernel is exactly this ufunc (inlined as one call).
_UFUNC1 = {
    "Tanh": np.tanh,
    "Exp": np.exp,
    "Neg": np.negative,
    "Abs": np.absolute,
    "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal,
    "Log": np.log,
    "Floor": np.floor,
    "Ceil": np.ceil,
}


def _acc_value(ctx: KernelContext) -> Value:
    out = ctx.node.outputs[0]
    t = out.type if out is not None else None
    return Value("acc", t if isinstance(t, TensorType) else None)


def build_step(ctx: KernelContext, registry: KernelRegistry, step: Step) -> Any:
    op, opset, attrs, refs = step
    acc = _acc_value(ctx)
    ins: list[Value | None] = [acc if r < 0 else ctx.node.inputs[r] for r in refs]
    node = Node(op, ins, [Value("_")], dict(attrs), name=f"{ctx.node_name}/{op}", opset=opset)
    return registry.lookup("", op, opset, node.name).build(KernelContext(node))


def step_code(op: str, fn: Any, args: list[str], out: str, dtype: Any, env: dict[str, Any],
               key: str) -> list[str]:  # fmt: skip
    """Statements computing one step into ``out``; binds what they use in ``env``. The
    text is ours (``op`` only selects among fixed forms; ``key`` is ours): attribute
    values reach the statements only through ``env`` (``fn`` is the step's kernel)."""
    if dtype is not None and np.dtype(dtype).kind == "f":
        t = np.dtype(dtype).type
        if op == "Relu":
            env["maximum"], env["zero"] = np.maximum, t(0)
            return [f"{{maximum}}({args[0]}, {{zero}}, out={out})"]
        if op == "Sigmoid":
            env.update(negative=np.negative, exp=np.exp, add=np.add, one=t(1))
            env["reciprocal"] = np.reciprocal
            return [
                f"{{negative}}({args[0]}, out={out})",
                f"{{exp}}({out}, out={out})",
                f"{{add}}({out}, {{one}}, out={out})",
                f"{{reciprocal}}({out}, out={out})",
            ]
        if op in _UFUNC1:
            env[key] = _UFUNC1[op]
            return [f"{{{key}}}({args[0]}, out={out})"]
    env[key] = fn
    return [f"{{{key}}}({', '.join(args)}, out={out})"]
