"""Which executor serves a model: the one place that decides, and says why.

``select_executor(requested, prepared, check, host=..., native_mode=...)`` runs once per
load on the loading thread, after ``compiler.prepare``, and returns the Executor with its
``why``, its ``run_async`` rule (``InlinePolicy``) and its notes set:

* ``"sync"``, ``"async"``, ``"native"``: that executor, or a load error saying why it
  cannot serve this model (async kernels need the async executor; an op without a native
  lowering, or no numba, for native);
* ``"auto"``: *async* when the model has ``async def`` kernels (they overlap with compute),
  or when the cost model predicts a call on the dataflow executor (critical path or work
  over the thread budget, plus scheduling and pool hops) at most ``THRESHOLDS.async_gain``
  of one on the sync interpreter (parallel branches of expensive kernels) -- unless kernels
  with big weights have dims the data sets (``_data_sized``: the prediction cannot size
  them); else *native*
  when numba imports, every op lowers (dynamic dims too: rows mode or per signature,
  ``native/runtime/tier.py``; auto then measures native against the interpreter per batch-size
  class or box of dims) and the cost model calls it tiny (``THRESHOLDS.native_max_flops``),
  or small with dims other than the batch (``native_dynamic_max_flops``: one function per
  box of dims, ``native/lower/generic.py``) (``$TFRT_PY_NATIVE=0`` turns this off), the
  generated function fits the compile budget (``native/lower/budget.py``,
  ``$TFRT_PY_NATIVE_BUDGET``) and the cache dir is safe
  (``concurrency/cachedir.py``); else *sync*, with the reason in ``describe()``.

Streamed models (``load(memory_budget=)``) are chosen before import, by
``tfrt_py.streaming``, and get the same policy and notes here (``finish``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from .compiler.cost import THRESHOLDS
from .compiler.prepare import Prepared
from .concurrency import HostContext, compiled_gate
from .concurrency.cachedir import UnsafeCacheDir, cache_dir
from .concurrency.threads import threads as thread_budget
from .errors import UnsupportedOpError
from .executors.base import Executor
from .executors.inline_policy import InlinePolicy
from .executors.interpreter import SyncInterpreter
from .executors.program import compile_program
from .feeds import FeedChecker
from .ir import Node, TensorType
from .native.runtime.availability import NativeUnavailable, available

if TYPE_CHECKING:  # imported when a model may use them
    from .compiler.shape_model import Fit
    from .executors.async_executor import AsyncExecutor
    from .native.lower.graph import Lowered

__all__ = ["EXECUTORS", "NATIVE_ENV", "finish", "rebuild", "select_executor"]

#: The executors a caller may ask for; "auto" picks per model.
EXECUTORS = ("auto", "sync", "async", "native")
#: ``$TFRT_PY_NATIVE=0`` keeps "auto" off the native tier.
NATIVE_ENV = "TFRT_PY_NATIVE"
#: ``$TFRT_PY_GENERIC_PLAN=0``: the sync interpreter plans per input signature.
GENERIC_ENV = "TFRT_PY_GENERIC_PLAN"
#: A cold start's stand-in fits the shape model only when its probes, on the kernels'
#: NumPy paths, are estimated at no more than this (~20-50 ms): a BERT-2L/128's are ~70
#: MFLOP and its stand-in then serves new lengths at ~1.4 ms instead of 3-5 ms (a plan and
#: generated code per length); a CNN's at full resolution are GFLOPs.
STAND_IN_PROBE_FLOPS = 2e8
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
        ex = _async_executor(prepared, check, host)
    else:
        interp = _interpreter(prepared, check)
        lowered: Lowered | None = None
        native = False
        if kind == "native":
            from .native.runtime.tier import plan_lowering

            if not available():
                raise NativeUnavailable(
                    "executor='native' needs numba, which cannot be imported here "
                    "(pip install 'tfrt-py[native]'); use executor='sync' or 'auto'"
                )
            cache_dir()  # UnsafeCacheDir before any work
            lowered, native = plan_lowering(prepared.graph, prepared.program,
                                            probe_budget=False), True  # fmt: skip
        elif requested == "auto" and compiled_gate.held():
            interp.native_deferred = True  # no lowering on a cold start's load path
            notes.append("native tier: decided once the compiled kernels are warm "
                         "(a cold start: tfrt_py.cold_start)")  # fmt: skip
        elif requested == "auto":
            native, lowered, why, reason = _auto_native(prepared, why)
            if reason:
                notes.append(f"native tier: not used: {reason}")
        ex = interp
        if native:  # auto measures the native tier against the interpreter (tier.py)
            from .native.runtime.tier import NativeTier

            ex = NativeTier(lowered, prepared.program, check, interp, mode=native_mode,
                            measure=requested == "auto", graph=prepared.graph)  # fmt: skip
    ex.why = why
    ex.notes = tuple(notes)
    return finish(ex, prepared, host)


def _nothing() -> None:
    return None


def rebuild(ex: Executor, old: Prepared) -> tuple[Executor, Prepared, Callable[[], None]]:
    """``ex``'s kind over a new program of ``old``'s graph (its kernels built anew), that
    Prepared, and what the caller runs when it installs them: a new sync interpreter or
    async executor with ``ex``'s why, notes and host (nothing to run); the native tier
    keeps itself and takes a new interpreter when the callable runs
    (``NativeTier.use_interpreter``); an interpreter whose native choice "auto" deferred
    is selected again (it may become the native tier). For a cold process's models
    switching to the compiled kernels (``tfrt_py.cold_start``)."""
    from .native.runtime.tier import NativeTier

    prepared = dataclasses.replace(old, program=compile_program(old.graph, old.registry))
    check = FeedChecker(prepared.graph.inputs)
    if ex.native_deferred:  # "auto" on a cold start: the native tier's choice now
        return select_executor("auto", prepared, check, host=ex.host,
                               native_mode="background"), prepared, _nothing  # fmt: skip
    if isinstance(ex, NativeTier):
        interp = _interpreter(prepared, check)
        return ex, prepared, lambda: ex.use_interpreter(interp, prepared.program)
    if ex.name == "async":
        new: Executor = _async_executor(prepared, check, ex.host)
    elif isinstance(ex, SyncInterpreter):
        new = _interpreter(prepared, check)
    else:
        raise TypeError(f"no rebuild for executor {ex.name!r}")
    new.why, new.notes = ex.why, ex.notes
    return finish(new, prepared, ex.host), prepared, _nothing


def _interpreter(prepared: Prepared, check: FeedChecker) -> SyncInterpreter:
    fit = _shape_fit(prepared)
    # a cold start's stand-in without a generic plan plans a signature only once its calls
    # cost more than a plan: a decoder step's plan (~20 ms) would not pay back before the
    # switch, nor a small model's (~2 ms of a fresh process's first result)
    per_signature = (fit is not None and fit.model is not None) or not compiled_gate.held()
    return SyncInterpreter(
        prepared.program, prepared.determined, check,
        computed_once=prepared.computed_per_signature, shape_fit=fit,
        per_signature=per_signature,
    )  # fmt: skip


def _async_executor(
    prepared: Prepared, check: FeedChecker, host: HostContext | None
) -> AsyncExecutor:
    from .executors.async_executor import AsyncExecutor  # here: a sync model skips the import

    return AsyncExecutor(
        prepared.program, prepared.registry, check, _off_loop(prepared), host,
        _loop_budget(prepared),
    )  # fmt: skip


def _shape_fit(prepared: Prepared) -> Fit | None:
    """The shape model behind the sync interpreter's one plan for every signature (None:
    static shapes, or ``$TFRT_PY_GENERIC_PLAN=0``: plans per signature). A cold start's
    stand-in (``compiled_gate.held()``) fits it only when its probes are cheap
    (``STAND_IN_PROBE_FLOPS``): they run the whole model ``2**n + 2`` times on the NumPy
    paths (2 s of a quantized ResNet-18's load) for an interpreter the warm-up replaces;
    the replacement fits on the compiled kernels."""
    generic_off = os.environ.get(GENERIC_ENV) == "0"
    inputs = prepared.graph.inputs
    if not generic_off and all(isinstance(v.type, TensorType) and v.type.is_static for v in inputs):
        return None
    from .compiler.shape_model import Fit, fit_shape_model  # here: static models skip it

    if generic_off:
        return Fit(None, f"${GENERIC_ENV}=0")
    program, determined = prepared.program, prepared.determined
    if compiled_gate.held():
        fit = fit_shape_model(program, determined, prepared.computed_per_signature,
                              STAND_IN_PROBE_FLOPS, prepared.cost.flops)  # fmt: skip
        if fit.model is None:
            fit.reason = f"a cold start's stand-in: {fit.reason}"
        return fit
    return fit_shape_model(program, determined, prepared.computed_per_signature)


def finish(ex: Executor, prepared: Prepared, host: HostContext | None) -> Executor:
    """Set what every executor gets from the selector: its host and its run_async rule."""
    ex.host = host
    ex.call_us = prepared.cost.call_us()
    ex.loop_slice_us = THRESHOLDS.loop_slice_us
    if ex.name != "async":
        ex.inline = InlinePolicy(prepared.cost.call_us(), prepared.graph.inputs, _opaque(prepared))
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
    """async or sync, by the predicted time of a call on each (``_predict``)."""
    cost = prepared.cost
    mflop = f"est. {cost.flops / 1e6:.2f} MFLOP per call"
    if async_nodes:
        return "async", f"auto: {len(async_nodes)} async kernel(s) to overlap ({mflop})"
    sync_us, async_us, lanes = _predict(prepared)
    figures = (f"predicted {sync_us:,.0f} µs per call on sync, {async_us:,.0f} µs on async "
               f"with {lanes} lane(s); {mflop}")  # fmt: skip
    if async_us < THRESHOLDS.async_gain * sync_us:
        unsized = _data_sized(prepared)
        if unsized:
            return "sync", (f"auto: {unsized} kernel(s) with big weights have dims that depend "
                            "on the data (a Resize to computed sizes, NonZero), which the cost "
                            "model cannot size; the interpreter's kernels split over the threads "
                            f"themselves ({figures})")  # fmt: skip
        return "async", f"auto: parallel branches pay for the pool hops ({figures})"
    return "sync", f"auto: the pool hops would cost more than parallel branches gain ({figures})"


def _data_sized(prepared: Prepared) -> int:
    """How many kernels with a big constant weight (``THRESHOLDS.big_weight`` elements) read
    or write a value of unknown rank or a dim that no graph input has: one the data sets (a
    detector resizes its image to sizes it computes), which the cost model counts as 1.
    Such a model's parallel branches look cheap while each of their convs is big enough to
    split over the threads on its own (RetinaNet R50 at 320: 140 ms a call on async, 120
    on sync)."""
    graph = prepared.program.graph
    known = {d for v in graph.inputs if isinstance(v.type, TensorType) and v.type.shape
             for d in v.type.shape if isinstance(d, str)}  # fmt: skip
    count = 0
    for node in graph.nodes:
        if not any(v is not None and v.const is not None and v.const.size >= THRESHOLDS.big_weight
                   for v in node.inputs):  # fmt: skip
            continue
        for v in (*node.inputs, *node.outputs):
            if v is None or v.const is not None:
                continue
            t = v.type
            dims = t.shape if isinstance(t, TensorType) else None
            if dims is None or any(d is None or (isinstance(d, str) and d not in known)
                                   for d in dims):  # fmt: skip
                count += 1
                break
    return count


def _predict(prepared: Prepared) -> tuple[float, float, int]:
    """(sync µs, async µs, lanes) for one call, from the cost model: sync runs every kernel
    in turn; async runs the critical path, or the total work over ``lanes`` threads when
    that is longer, plus its per-kernel scheduling and a pool hop per expensive kernel off
    the critical path. ``lanes``: the thread budget, at most the widest point of the
    graph (two independent expensive kernels make two lanes)."""
    cost, t = prepared.cost, THRESHOLDS
    nodes = prepared.program.graph.nodes
    total = 0.0
    reach: dict[int, tuple[float, int]] = {}  # value id -> (longest path to it, expensive on it)
    for node in nodes:
        us = cost.of(node).us or 0.0
        total += us
        start = max((reach[id(v)] for v in node.inputs if v is not None and id(v) in reach),
                    default=(0.0, 0))  # fmt: skip
        done = (start[0] + us, start[1] + cost.expensive(node))
        for v in node.outputs:
            if v is not None:
                reach[id(v)] = done
    critical, expensive_on_path = max(reach.values(), default=(0.0, 0))
    expensive = sum(cost.expensive(node) for node in nodes)
    lanes = max(1, min(thread_budget(), expensive))
    k = len(nodes)
    sync_us = total + k * t.kernel_overhead_us
    async_us = (max(critical, total / lanes) + k * t.dataflow_overhead_us
                + max(0, expensive - expensive_on_path) * t.pool_hop_us)  # fmt: skip
    return sync_us, async_us, lanes


def _auto_native(prepared: Prepared, why: str) -> tuple[bool, Lowered | None, str, str]:
    """(native?, lowered (None: per signature), why, reason it is not used or "")."""
    if not available():
        return False, None, why, "numba cannot be imported (pip install 'tfrt-py[native]')"
    from .native.lower.graph import Declined, blockers, dynamic_inputs

    reasons = blockers(prepared.graph)
    if reasons:
        return False, None, why, "; ".join(reasons)
    if os.environ.get(NATIVE_ENV) == "0":
        return False, None, why, f"${NATIVE_ENV}=0"
    flops = prepared.cost.flops
    too_big = (f"every op lowers, but at est. {flops / 1e6:.2f} MFLOP per call the model "
               "is not tiny (executor='native' forces it)")  # fmt: skip
    big = flops > THRESHOLDS.native_max_flops
    if flops > THRESHOLDS.native_dynamic_max_flops or (big and not any(dynamic_inputs(
            prepared.graph))):  # fmt: skip
        return False, None, why, too_big
    from .native.runtime.tier import plan_lowering  # here: only a model it may lower

    try:
        cache_dir()
        lowered = plan_lowering(prepared.graph, prepared.program)
    except (Declined, UnsafeCacheDir, OSError) as e:
        return False, None, why, f"{type(e).__name__}: {e}"
    if not big:
        what = "a tiny model"
    elif lowered is None:  # dynamic dims: boxes, measured against the interpreter
        what = "a model with dynamic dims"
    else:
        return False, None, why, too_big
    return (
        True,
        lowered,
        (
            f"auto: {what} (est. {flops / 1e6:.3f} MFLOP per call, no async kernels, "
            "better served by one thread) whose ops all lower"
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
