"""Which executor serves a model: the one place that decides, and says why.

``select_executor(requested, prepared, check, host=..., native_mode=...)`` runs once per
load on the loading thread, after ``compiler.prepare``, and returns the Executor with its
``why``, its ``run_async`` rule (``InlinePolicy``) and its notes set:

* ``"sync"``, ``"async"``, ``"native"``: that executor, or a load error saying why it
  cannot serve this model (async kernels need the async executor; an op without a native
  lowering, or no numba, for native);
* ``"auto"``: *async* when the model has ``async def`` kernels (they overlap with compute),
  or two expensive kernels with no path between them (the cost model's classification:
  they can run in parallel on the pool); else *native* when numba imports, every op lowers
  (dynamic dims too: rows mode or per signature, ``native/tier.py``; auto then measures
  native against the interpreter per batch-size class) and the cost model calls it tiny
  (``THRESHOLDS.native_max_flops``; ``$TFRT_PY_NATIVE=0`` turns this off), the generated
  function fits the compile budget (``native/budget.py``, ``$TFRT_PY_NATIVE_BUDGET``) and
  the cache dir is safe (``native/cachedir.py``); else *sync*, with the reason in ``describe()``.

Streamed models (``load(memory_budget=)``) are chosen before import, by
``tfrt_py.streaming``, and get the same policy and notes here (``finish``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .compiler.cost import THRESHOLDS, ModelCost
from .compiler.prepare import Prepared
from .concurrency import HostContext, hop_us
from .errors import UnsupportedOpError
from .executors.async_executor import AsyncExecutor
from .executors.base import Executor, InlinePolicy
from .executors.interpreter import SyncInterpreter
from .feeds import FeedChecker
from .ir import Node
from .native.cachedir import UnsafeCacheDir, cache_dir
from .native.compile import NativeUnavailable, available
from .native.lower import Declined, Lowered, blockers
from .native.tier import NativeTier, plan_lowering

__all__ = ["EXECUTORS", "NATIVE_ENV", "finish", "select_executor"]

#: The executors a caller may ask for; "auto" picks per model.
EXECUTORS = ("auto", "sync", "async", "native")
#: ``$TFRT_PY_NATIVE=0`` keeps "auto" off the native tier.
NATIVE_ENV = "TFRT_PY_NATIVE"
_ITERATING = frozenset({"Loop", "Scan", "SequenceMap"})


def select_executor(
    requested: str,
    prepared: Prepared,
    check: FeedChecker,
    *,
    host: HostContext | None,
    native_mode: str,
) -> Executor:
    """The executor for ``prepared`` (see the module docstring)."""
    if requested not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {requested!r}")
    program = prepared.program
    async_nodes = _async_nodes(prepared)
    if requested == "sync" and async_nodes:
        raise _unsupported(async_nodes[0], "async kernels need the async executor "
                           "(executor='async' or 'auto')")  # fmt: skip
    notes: list[str] = []
    why = "requested"
    if requested == "auto":
        kind, why = _auto_kind(prepared, async_nodes)
    else:
        kind = requested
    ex: Executor
    if kind == "async":
        ex = AsyncExecutor(
            program, prepared.registry, check, _off_loop(prepared), host, _loop_budget(prepared)
        )
    else:
        interp = SyncInterpreter(program, prepared.determined, check)
        lowered: Lowered | None = None
        native = False
        if kind == "native":
            if not available():
                raise NativeUnavailable(
                    "executor='native' needs numba, which cannot be imported here "
                    "(pip install 'tfrt-py[native]'); use executor='sync' or 'auto'"
                )
            cache_dir()  # UnsafeCacheDir before any work
            lowered, native = plan_lowering(prepared.graph, program), True
        elif requested == "auto":
            native, lowered, why, reason = _auto_native(prepared, why)
            if reason:
                notes.append(f"native tier: not used: {reason}")
        # auto measures the native tier against the interpreter per signature (tier.py)
        ex = interp if not native else NativeTier(
            lowered, program, check, interp, mode=native_mode, measure=requested == "auto",
            graph=prepared.graph)  # fmt: skip
    ex.why = why
    ex.notes = tuple(notes)
    return finish(ex, prepared, host)


def finish(ex: Executor, prepared: Prepared, host: HostContext | None) -> Executor:
    """Set what every executor gets from the selector: its host and its run_async rule."""
    ex.host = host
    if not isinstance(ex, AsyncExecutor):
        ex.inline = InlinePolicy(
            prepared.cost.call_us(), hop_us(), prepared.graph.inputs, _opaque(prepared)
        )
    return ex


def _off_loop(prepared: Prepared) -> Callable[[Node], bool]:
    """The async executor's "expensive" (never inline on an event loop's thread): the cost
    model's class, and every kernel whose cost is unknown at load -- Loop/Scan/SequenceMap
    (their trip count is data) and impure (custom) kernels."""
    cost, registry = prepared.cost, prepared.registry

    def expensive(node: Node) -> bool:
        if cost.expensive(node) or node.op_type in _ITERATING:
            return True
        if not registry.has(node.domain, node.op_type, node.opset):
            return False
        flags = registry.lookup(node.domain, node.op_type, node.opset).flags
        return not flags.pure and not flags.is_async

    return expensive


def _loop_budget(prepared: Prepared) -> tuple[Callable[[Node], float], float]:
    """(estimated µs of a kernel on the async executor, the inline budget on a loop)."""
    cost, t = prepared.cost, THRESHOLDS

    def us(node: Node) -> float:
        c = cost.nodes.get(id(node))
        return t.dataflow_overhead_us + (c.us or 0.0 if c is not None else 0.0)

    return us, t.loop_budget_us


def _opaque(prepared: Prepared) -> str:
    """Why a call's cost cannot be estimated at load, or "": iterations whose count is
    data (Loop, Scan, SequenceMap), or kernels that are not pure (custom kernels)."""
    ops = sorted({n.op_type for n in prepared.graph.walk() if n.op_type in _ITERATING})
    if ops:
        return f"{'/'.join(ops)} iterations"
    impure = sorted({ins.node.op_type for ins in prepared.program.instrs if not ins.flags.pure})
    return f"impure kernels ({', '.join(impure)})" if impure else ""


def _auto_kind(prepared: Prepared, async_nodes: list[Node]) -> tuple[str, str]:
    cost = prepared.cost
    mflop = f"est. {cost.flops / 1e6:.2f} MFLOP per call"
    if async_nodes:
        return "async", f"auto: {len(async_nodes)} async kernel(s) to overlap"
    pair = _parallel_expensive(prepared.program.graph.nodes, cost)
    if pair:
        return "async", (f"auto: expensive kernels {pair[0]!r} and {pair[1]!r} can run in "
                         f"parallel ({mflop})")  # fmt: skip
    return "sync", (f"auto: no async kernels and no parallel expensive kernels ({mflop}): "
                    "the pool hop would cost more")  # fmt: skip


def _auto_native(prepared: Prepared, why: str) -> tuple[bool, Lowered | None, str, str]:
    """(native?, lowered (None: per signature), why, reason it is not used or "")."""
    if not available():
        return False, None, why, "numba cannot be imported (pip install 'tfrt-py[native]')"
    reasons = blockers(prepared.graph)
    if reasons:
        return False, None, why, "; ".join(reasons)
    if os.environ.get(NATIVE_ENV) == "0":
        return False, None, why, f"${NATIVE_ENV}=0"
    flops = prepared.cost.flops
    if flops > THRESHOLDS.native_max_flops:
        too_big = (f"every op lowers, but at est. {flops / 1e6:.2f} MFLOP per call the model "
                   "is not tiny (executor='native' forces it)")  # fmt: skip
        return False, None, why, too_big
    try:
        cache_dir()
        lowered = plan_lowering(prepared.graph, prepared.program)
    except (Declined, UnsafeCacheDir, OSError) as e:
        return False, None, why, f"{type(e).__name__}: {e}"
    return (
        True,
        lowered,
        (
            f"auto: a tiny model (est. {flops / 1e6:.3f} MFLOP per call, no async kernels, no "
            "parallel expensive kernels: the pool hop would cost more) whose ops all lower"
        ),
        "",
    )


def _async_nodes(prepared: Prepared) -> list[Node]:
    """The top-level nodes with async kernels; async kernels in nested graphs are an
    error (nested graphs run synchronously)."""
    program, registry = prepared.program, prepared.registry
    top = {id(ins.node) for ins in program.instrs}
    for node in program.graph.walk():
        if id(node) in top or not registry.has(node.domain, node.op_type, node.opset):
            continue
        if registry.lookup(node.domain, node.op_type, node.opset).flags.is_async:
            raise _unsupported(node, "async kernels inside If/Loop/Scan bodies are not "
                               "supported (nested graphs run synchronously)")  # fmt: skip
    return [ins.node for ins in program.instrs if ins.flags.is_async]


def _unsupported(node: Node, detail: str) -> UnsupportedOpError:
    return UnsupportedOpError(node.op_type, node.domain, node.opset, node.name, detail)


def _parallel_expensive(nodes: list[Node], cost: ModelCost) -> tuple[str, str] | None:
    """Two expensive kernels with no path between them (names), or None.

    Load time only: an ancestor bitset per value over the expensive nodes seen so far.
    """
    expensive = {id(n) for n in nodes if cost.expensive(n)}
    if len(expensive) < 2:
        return None
    bit: dict[int, int] = {}  # value id -> bitset of expensive ancestors (inclusive)
    order: list[Node] = []
    for n in nodes:
        anc = 0
        for v in n.inputs:
            if v is not None:
                anc |= bit.get(id(v), 0)
        if id(n) in expensive:
            for i, other in enumerate(order):
                if not anc >> i & 1:
                    return other.name, n.name
            anc |= 1 << len(order)
            order.append(n)
        for v in n.outputs:
            if v is not None:
                bit[id(v)] = anc
    return None
