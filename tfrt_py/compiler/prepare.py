"""What ``load`` asks of the compiler: one call that optimizes a verified graph, compiles
it, and prices it once.

``prepare(graph, registry, optimize)`` returns a ``Prepared``: the optimized graph (a
clone; the caller's graph is untouched), the registry it was compiled with, the
pass reports, the compiled top-level ``Program``, the cost model's ``ModelCost``, the ids
of values whose shape the input signature fixes (what the sync interpreter plans) and of
values whose data it fixes (what a plan computes once).
Runs once per load, on the caller's thread; the result is immutable.
"""

from __future__ import annotations

import collections
from collections.abc import Collection

from ..executors.program import Program, compile_program
from ..ir import Graph
from ..kernels import KernelRegistry
from ..records import record
from .context import PassContext, flags_lookup
from .cost import ModelCost, model_cost
from .dynamic import signature_determined
from .pipeline import PassReport, optimize, select_passes

__all__ = ["Prepared", "prepare"]


@record(frozen=True)
class Prepared:
    """The optimized graph, the registry it runs with, what each pass did, the compiled
    program, its cost, and the values whose shape the signature determines."""

    graph: Graph
    registry: KernelRegistry
    reports: list[PassReport]
    loaded_ops: collections.Counter[str]
    program: Program
    cost: ModelCost
    determined: set[int]
    #: values whose data the signature fixes (shape arithmetic): a plan computes them once
    computed_per_signature: set[int]

    def describe_lines(self) -> list[str]:
        """``describe()`` lines: the ops as loaded, the cost model, one line per pass."""
        lines = [
            "  ops as loaded: " + ", ".join(f"{k} x{v}" for k, v in self.loaded_ops.most_common()),
            "  " + self.cost.summary(),
            "  passes:",
        ]
        return lines + [f"    {r}" for r in self.reports]


def prepare(
    graph: Graph, registry: KernelRegistry, optimize_arg: bool | Collection[str] | None
) -> Prepared:
    """Optimize, compile and price ``graph`` for ``load(..., optimize=optimize_arg)``.

    ``optimize_arg``: None or True for every pass, False for none, or a collection of pass
    names; ``$TFRT_PY_DISABLE_PASSES`` then removes passes (see ``pipeline``). A missing
    kernel or an unsupported attribute fails here (UnsupportedOpError naming the node).
    """
    passes = select_passes(optimize_arg)
    loaded = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.nodes
    )
    g, reports = optimize(graph, registry, passes)
    program = compile_program(g, registry)
    shapes, contents = signature_determined(g, flags_lookup(PassContext(registry)))
    cost = model_cost(g, registry)
    return Prepared(g, registry, reports, loaded, program, cost, shapes, contents)
