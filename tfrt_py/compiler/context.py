"""What every load-time pass is given besides the graph (``PassContext``) and the helpers
on it that several passes share. The pipeline (``pipeline.py``) imports the passes; the
passes import this module, never the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir import Node
from ..kernels import KernelFlags, KernelRegistry
from ..records import record

__all__ = ["PassContext", "PassFn", "flags_lookup"]


@record
class PassContext:
    """What a pass may use besides the graph: the registry the model runs with (fused
    kernels included)."""

    registry: KernelRegistry


def flags_lookup(ctx: PassContext) -> Callable[[Node], KernelFlags | None]:
    """``flags_of(node)`` over the context's registry (None for an op with no kernel)."""

    def flags_of(node: Node) -> Any:
        try:
            return ctx.registry.lookup(node.domain, node.op_type, node.opset).flags
        except Exception:  # noqa: BLE001 - an unknown op is simply "not known pure"
            return None

    return flags_of


PassFn = Callable[[Any, PassContext], str]
