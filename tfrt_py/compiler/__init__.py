"""Load-time compilation: graph passes, the cost model, ``prepare``. Nothing here runs
once ``load`` has returned (the fused ops' kernels are a kernel family:
``kernels/fused/``).

``optimize`` runs the passes (each switchable, each reporting one line); ``model_cost``
prices a graph once per load (FLOPs, bytes, µs per node; every threshold in
``THRESHOLDS``) for the executors' cheap/expensive decisions and the executor choice;
``shape_determined`` tells the memory planner which values it may plan;
``prepare`` is the one call ``load`` makes.
"""

from __future__ import annotations

from .cost import THRESHOLDS as THRESHOLDS
from .cost import ModelCost as ModelCost
from .cost import estimate_cost as estimate_cost
from .cost import graph_cost as graph_cost
from .cost import model_cost as model_cost
from .dynamic import shape_determined as shape_determined
from .pipeline import ENV_DISABLE as ENV_DISABLE
from .pipeline import PASSES as PASSES
from .pipeline import PassReport as PassReport
from .pipeline import optimize as optimize
from .pipeline import select_passes as select_passes

__all__ = [
    "ENV_DISABLE",
    "PASSES",
    "THRESHOLDS",
    "ModelCost",
    "PassReport",
    "estimate_cost",
    "graph_cost",
    "model_cost",
    "optimize",
    "select_passes",
    "shape_determined",
]
