"""Load-time compilation: graph passes, fused kernels, the cost model, the executor choice.

``optimize`` runs the passes (each switchable, each reporting one line); ``estimate_cost``
prices one node (FLOPs, bytes) for the executors' cheap/expensive decisions and for the
per-model executor choice; ``shape_determined`` tells the memory planner which values it
may plan; ``with_fused_kernels`` adds the fused ops' kernels to a registry; ``prepare``
is the one call ``load`` makes.
"""

from __future__ import annotations

from .cost import estimate_cost as estimate_cost
from .cost import graph_cost as graph_cost
from .cost import is_expensive as is_expensive
from .dynamic import shape_determined as shape_determined
from .fused_kernels import with_fused_kernels as with_fused_kernels
from .pipeline import ENV_DISABLE as ENV_DISABLE
from .pipeline import PASSES as PASSES
from .pipeline import PassReport as PassReport
from .pipeline import optimize as optimize
from .pipeline import select_passes as select_passes

__all__ = [
    "ENV_DISABLE",
    "PASSES",
    "PassReport",
    "estimate_cost",
    "graph_cost",
    "is_expensive",
    "optimize",
    "select_passes",
    "shape_determined",
    "with_fused_kernels",
]
