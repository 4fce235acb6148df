"""What ``load`` asks of the compiler: one call that optimizes a verified graph, and the
pieces the sync interpreter and ``describe()`` need afterwards.

``prepare(graph, registry, optimize)`` returns a ``Prepared``: the optimized graph (a
clone; the caller's graph is untouched), the registry with the fused kernels added, and
the pass reports. ``Prepared.interpreter(program, check)`` builds the sync interpreter
over the compiled program. Runs once per load, on the caller's thread.
"""

from __future__ import annotations

import collections
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ..executors.interpreter import SyncInterpreter
from ..executors.program import Program
from ..ir import Graph
from ..kernels import KernelRegistry
from .cost import estimate_cost, is_expensive
from .dynamic import shape_determined
from .fused_kernels import with_fused_kernels
from .pipeline import PassContext, PassReport, optimize, select_passes
from .shapes import flags_lookup

__all__ = ["Prepared", "prepare"]


@dataclass
class Prepared:
    """The optimized graph, the registry it runs with, and what each pass did."""

    graph: Graph
    registry: KernelRegistry
    reports: list[PassReport]
    loaded_ops: collections.Counter[str]

    def interpreter(self, program: Program, check: Any) -> SyncInterpreter:
        """The sync interpreter over ``program`` (compiled from ``self.graph``)."""
        flags_of = flags_lookup(PassContext(self.registry))
        return SyncInterpreter(program, shape_determined(self.graph, flags_of), check)

    def describe_lines(self, interp: SyncInterpreter | None) -> list[str]:
        """``describe()`` lines: one per pass, then the memory plans made so far."""
        costs = [estimate_cost(n, self.registry) for n in self.graph.nodes]
        n_big = sum(is_expensive(c) for c in costs)
        lines = [
            "  ops as loaded: " + ", ".join(f"{k} x{v}" for k, v in self.loaded_ops.most_common()),
            f"  cost model: {sum(c.flops for c in costs) / 1e6:.3f} MFLOP, "
            f"{sum(c.bytes for c in costs) / 1e6:.3f} MB per call (symbolic dims as 1); "
            f"{n_big} of {len(costs)} kernels expensive",
            "  passes:",
        ]
        lines += [f"    {r}" for r in self.reports]
        if interp is None:
            return lines
        plans = interp.plans()
        if not plans:
            lines.append("  memory: planned per input signature on the first call (none yet)")
        else:
            lines.append(f"  memory: {len(plans)} plan(s), one per input signature:")
            lines += [f"    {p.summary()}" for p in plans]
        return lines


def prepare(
    graph: Graph, registry: KernelRegistry, optimize_arg: bool | Collection[str] | None
) -> Prepared:
    """Optimize ``graph`` for ``load(..., optimize=optimize_arg)``.

    ``optimize_arg``: None or True for every pass, False for none, or a collection of pass
    names; ``$TFRT_PY_DISABLE_PASSES`` then removes passes (see ``pipeline``).
    """
    passes = select_passes(optimize_arg)
    loaded = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.nodes
    )
    reg = with_fused_kernels(registry)
    g, reports = optimize(graph, reg, passes)
    return Prepared(g, reg, reports, loaded)
