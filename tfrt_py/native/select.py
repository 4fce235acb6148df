"""When a model runs on the native tier: ``load``'s decision and ``describe()``'s reason.

``choose(requested, chosen, why, program, registry)`` runs at load on the loading thread,
after the sync/async choice: ``executor="native"`` lowers or raises (Declined naming
what blocks it, NativeUnavailable without numba); ``"auto"`` moves a model the sync
interpreter would serve to the native tier when numba is importable, every op lowers and
the cost model calls it tiny (at most ``NATIVE_MAX_FLOPS`` per call: above that NumPy's
BLAS calls amortize their overhead and the interpreter is as fast). ``$TFRT_PY_NATIVE=0``
keeps "auto" off the native tier. Either way the generated function must fit the compile
budget (``budget.py``: "native" raises OverBudget naming ``$TFRT_PY_NATIVE_BUDGET``, "auto"
stays on the interpreter) and the cache dir must be safe
(``cachedir.check_dir``): "native" raises UnsafeCacheDir, "auto" stays on the interpreter.
Why "auto" declined a model is remembered per graph (weakly) for ``unused_reason``.
"""

from __future__ import annotations

import os
import weakref

from ..compiler.cost import graph_cost
from ..executors.program import Program
from ..ir import Graph
from ..kernels import KernelRegistry
from .cachedir import UnsafeCacheDir, cache_dir
from .compile import NativeUnavailable, available
from .lower import Declined, Lowered, blockers, lower

__all__ = ["NATIVE_ENV", "NATIVE_MAX_FLOPS", "choose", "unused_reason"]

#: Tiny: at most this many FLOPs per call (M2, a 64-256-256-10 MLP, is 0.17 MFLOP).
NATIVE_MAX_FLOPS = 1e6
NATIVE_ENV = "TFRT_PY_NATIVE"

#: Why "auto" declined a graph whose ops all lower (a lowering's reason, the cache dir).
_declined: weakref.WeakKeyDictionary[Graph, str] = weakref.WeakKeyDictionary()


def choose(
    requested: str, chosen: str, why: str, program: Program, registry: KernelRegistry
) -> tuple[str, str, Lowered | None]:
    """(executor, why, lowered module or None)."""
    graph = program.graph
    if requested == "native":
        if not available():
            raise NativeUnavailable(
                "executor='native' needs numba, which cannot be imported here "
                "(pip install numba); use executor='sync' or 'auto'"
            )
        cache_dir()  # UnsafeCacheDir before any work
        return "native", "requested", lower(graph, program)
    if requested != "auto" or chosen != "sync" or os.environ.get(NATIVE_ENV) == "0":
        return chosen, why, None
    if not available() or blockers(graph):
        return chosen, why, None
    flops = graph_cost(graph, registry).flops
    if flops > NATIVE_MAX_FLOPS:
        return chosen, why, None
    try:
        cache_dir()
        lowered = lower(graph, program)
    except (Declined, UnsafeCacheDir, OSError) as e:
        _declined[graph] = f"{type(e).__name__}: {e}"
        return chosen, why, None
    return (
        "native",
        (
            f"auto: a tiny model (est. {flops / 1e6:.3f} MFLOP per call, no async kernels, no "
            "parallel expensive kernels: the pool hop would cost more) whose ops all lower"
        ),
        lowered,
    )


def unused_reason(graph: Graph, registry: KernelRegistry) -> str:
    """Why a model is not on the native tier (for ``describe()``)."""
    if not available():
        return "numba cannot be imported"
    reasons = blockers(graph)
    if reasons:
        return "; ".join(reasons)
    if os.environ.get(NATIVE_ENV) == "0":
        return f"${NATIVE_ENV}=0"
    declined = _declined.get(graph)
    if declined is not None:
        return declined
    flops = graph_cost(graph, registry).flops
    if flops > NATIVE_MAX_FLOPS:
        return (
            f"every op lowers, but at est. {flops / 1e6:.2f} MFLOP per call the model is not "
            "tiny (executor='native' forces it)"
        )
    return "every op lowers (executor='native' forces it)"
