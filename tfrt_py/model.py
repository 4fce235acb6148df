"""``load()`` in four stages, and ``Model``, the thin facade over one executor.

1. **read**: path / bytes / ``onnx.ModelProto`` -> IR (``frontends.onnx``), or a
   ``tfrt_py.ir.Graph`` as given; verified;
2. **prepare**: ``compiler.prepare`` optimizes, compiles and prices the graph once;
3. **select**: ``selection.select_executor`` picks and builds the executor, with one "why"
   (a streamed load, ``memory_budget=``, gets its executor from ``tfrt_py.streaming``);
4. **Model**: what the user holds: specs, ``run``/``run_async``/``run_batches``, deadlines
   (``timeout=``), the in-flight bound (``max_concurrency=``), ``describe()``.

Who owns what: a Model owns its executor, which owns the compiled program; all are
immutable after load (the sync interpreter adds plans per signature, the native tier
switches to compiled code once), so ``run`` may be called from many threads at once and
each call owns its state. The async executor and offloaded ``run_async`` calls borrow a
HostContext (the caller's ``host=``, or ``default_host()``).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any

import numpy as np

from . import cold_start, row_split
from .calls import CallContext, check_timeout
from .compiler.prepare import Prepared, prepare
from .concurrency import HostContext, Limiter, native_threads
from .concurrency.call_yield import BACKGROUND as _BACKGROUND
from .concurrency.call_yield import in_call
from .concurrency.threads import configure as configure_threads
from .concurrency.threads import limit_blas
from .concurrency.threads import threads as thread_budget
from .errors import InputError
from .executors.base import Executor
from .feeds import FeedChecker, TensorSpec, spec_of, warmup_feeds
from .generation import GenerationMixin
from .ir import Graph
from .kernels import default_registry
from .kernels.custom import CustomKernels, with_custom
from .metadata import ModelMetadata, from_graph
from .reading import read_source
from .selection import EXECUTORS, finish, rebuild, select_executor

if TYPE_CHECKING:
    from .profiling import ProfileReport

__all__ = ["EXECUTORS", "Model", "load"]

#: ``load(..., native=...)``: compile in the background (serve on the interpreter
#: meanwhile) or before ``load`` returns.
NATIVE_MODES = ("background", "eager")
#: Calls per warmed-up signature after its native compile (the tier's measured trial).
WARMUP_CALLS = 8


def load(
    source: Any,
    *,
    executor: str = "auto",
    custom_kernels: CustomKernels | None = None,
    host: HostContext | None = None,
    optimize: bool | Collection[str] | None = None,
    memory_budget: int | None = None,
    native: str = "background",
    timeout: float | None = None,
    max_concurrency: int | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    threads: int | None = None,
    warmup: Iterable[Mapping[str, Any]] | None = None,
) -> Model:
    """Load a model from a path, bytes, ``onnx.ModelProto`` or ``tfrt_py.ir.Graph``.

    Everything that can fail for a bad model fails here, not at the first call: an
    unreadable or malformed file, an unsupported op or opset (naming op, domain, opset and
    node), a malformed graph.

    ``executor``: "auto" (default) picks per model -- "async" (the dataflow executor) for
    ``async def`` kernels or parallel expensive kernels, "native" for a tiny model whose
    ops all lower, else "sync"; ``describe()`` says why. ``host`` is the HostContext the
    async executor and offloaded ``run_async`` calls run on (default: ``default_host()``).

    ``optimize`` picks the load-time passes: None/True all, False none, or a set of names
    from ``tfrt_py.compiler.PASSES``; ``$TFRT_PY_DISABLE_PASSES=a,b`` turns passes off.

    ``memory_budget`` (bytes): when the weights exceed it, external-data weights stream
    from disk by stage (executor "stream", see ``tfrt_py.streaming``); else a normal load.

    ``native``: "background" serves calls on the sync interpreter until the native code is
    compiled; "eager" compiles before returning. In a fresh process "background" builds
    on the kernels' NumPy paths (no ~1-2 s wait for numba) and switches to the compiled
    kernels once warm (``tfrt_py.cold_start``, ``Model.wait_compiled``).

    ``timeout`` (seconds): the default deadline of every call (``run(..., timeout=)``
    overrides it per call); ``max_concurrency``: at most this many calls in flight, the
    others wait first come, first served (``run_async`` waits without blocking its loop).

    ``threads``: how many threads one call may use (large matrix products and convs split
    over native threads -- numba's parallel loops on tfrt_py's pool -- or tfrt_py's Python
    intra-op pool; NumPy's BLAS runs single-threaded so nothing spins against a busy
    neighbour). Process-wide:
    ``$TFRT_PY_THREADS`` overrides it, the last value given applies, the default is the
    cores this process may use (``concurrency.threads``).

    ``base_dir``: the directory external-data locations are relative to, for a bytes or
    ``onnx.ModelProto`` source (required when it has external data; a path source uses its
    own directory, and ``base_dir`` may only repeat it). External data is only read from
    regular files inside that directory (docs/security.md).

    ``warmup``: input signatures to prepare before ``load`` returns, each a mapping of input
    name to a shape (a tuple; dims of 1 give the smallest feeds) or to an example array:
    each is run once (its plan or instance made, its dim bucket checked) and, on the native
    tier, compiled and measured, so the first real call of those shapes is served at full
    speed (``Model.warmup``).
    """
    _check_choices(native, executor)
    configure_threads(threads)
    default_timeout = check_timeout(timeout)
    limiter = None if max_concurrency is None else Limiter(max_concurrency)
    t0 = time.perf_counter()
    registry = with_custom(default_registry(), custom_kernels)
    # a cold process builds on NumPy paths and switches later (tfrt_py.cold_start)
    with cold_start.building(native if memory_budget is None else "eager") as cold:
        read, origin, meta, how = read_source(source, base_dir, memory_budget, registry,
                                              optimize, executor)  # fmt: skip
        if not isinstance(read, Graph):  # streamed: tfrt_py.streaming prepared and selected it
            runtime = finish(read, read.prepared, host)
            limit_blas()
            return Model(read.graph, runtime, read.prepared, origin,
                         time.perf_counter() - t0, default_timeout, limiter, meta, how)  # fmt: skip
        prepared = prepare(read, registry, optimize)  # 2. prepare
        check = FeedChecker(prepared.graph.inputs)  # 3. select
        runtime = select_executor(executor, prepared, check, host=host, native_mode=native)
        limit_blas()  # a BLAS the preparation loaded (SciPy's, via numba) runs one thread too
        load_s = time.perf_counter() - t0  # 4. the facade
        model = Model(prepared.graph, runtime, prepared, origin, load_s, default_timeout,
                      limiter, meta, how)  # fmt: skip
        if cold:
            model._switched = cold_start.switch_later(model)
            model._plain = False  # calls tell the warm-up (call_yield.in_call) until it switches
    if warmup is not None:
        model.warmup(warmup)
    return model


def _check_choices(native: str, executor: str) -> None:
    """ValueError unless ``native`` and ``executor`` name a known mode and executor."""
    if native not in NATIVE_MODES:
        raise ValueError(f"native must be one of {NATIVE_MODES}, got {native!r}")
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")


class Model(GenerationMixin):
    """A loaded model. Create with ``tfrt_py.load``.

    ``inputs``/``outputs`` are TensorSpecs; ``executor`` names the executor serving it
    (``runtime`` is that Executor object, which a cold start's switch may replace, and
    ``prepared`` the compiler's result). ``run`` may be called from many threads at once.
    A KV-cache decoder also generates (``generate``/``stream``/``generate_async``)."""

    def __init__(
        self,
        graph: Graph,
        runtime: Executor,
        prepared: Prepared,
        origin: str,
        load_s: float,
        timeout: float | None = None,
        limiter: Limiter | None = None,
        metadata: ModelMetadata | None = None,
        obtained: str = "",
    ) -> None:
        self._graph = graph
        #: How ``load`` got the graph ("imported", "the graph read from the import
        #: cache", ...), for ``describe()``.
        self._obtained = obtained
        #: What the ONNX file says about itself (producer, versions, doc strings,
        #: ``metadata_props``): ``tfrt_py.metadata``; read-only.
        self.metadata = metadata if metadata is not None else from_graph(graph.name, graph.opsets)
        self._runtime = runtime
        self._prepared = prepared
        self._origin = origin
        self._load_s = load_s
        self._timeout = timeout
        self._limiter = limiter
        #: Big batches in chunks of rows (``row_split``), or None and why not.
        self._rows, self._rows_why = row_split.plan(graph, threads=thread_budget())
        #: True when no call needs a context or a split: ``run`` goes straight to the
        #: executor (``_plain_now``).
        self._plain = self._plain_now()
        self.executor: str = runtime.name
        self.inputs: list[TensorSpec] = [spec_of(v) for v in graph.inputs if v.default is None]
        #: Initializers a call may override by feeding them (ONNX IR >= 4 graph inputs that
        #: have an initializer; onnxruntime's get_overridable_initializers).
        self.overridable_initializers = [spec_of(v) for v in graph.inputs if v.default is not None]
        self.outputs: list[TensorSpec] = [spec_of(v) for v in graph.outputs]
        #: signatures warmed up and the seconds it took (``warmup``)
        self._warmup: tuple[int, float] = (0, 0.0)
        self._switched: threading.Event | None = None  # cold start's switch (cold_start)

    @property
    def graph(self) -> Graph:
        """The IR graph this model runs (read-only)."""
        return self._graph

    @property
    def runtime(self) -> Executor:
        """The Executor serving this model (``tfrt_py.executors.base``; read-only)."""
        return self._runtime

    @property
    def prepared(self) -> Prepared:
        """What the compiler made of the graph: passes' reports, registry, program, cost."""
        return self._prepared

    @property
    def native(self) -> Any:
        """The native tier (``state``, ``wait()``, ``compiled``) when the model runs on
        executor "native", else None."""
        return self._runtime if self._runtime.name == "native" else None

    @property
    def limiter(self) -> Limiter | None:
        """The in-flight bound (``max_concurrency``), or None."""
        return self._limiter

    # -- calls ---------------------------------------------------------------------------
    def run(
        self,
        feeds: Mapping[str, Any],
        outputs: Mapping[str, np.ndarray] | None = None,
        *,
        timeout: float | None = None,
        output_names: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the model on ``feeds`` (input name -> array); outputs by name, in
        ``model.outputs`` order, each a fresh array the caller owns. Raises InputError for
        bad feeds, ExecutionError naming the node for a kernel failure, DeadlineExceeded
        (a TimeoutError) past ``timeout`` seconds (default: the model's); the model stays
        usable either way.

        ``outputs`` (name -> array of the output's shape and dtype) are filled in place and
        returned; they must not overlap a feed. ``output_names``: return only these
        outputs, in this order (onnxruntime's ``run(output_names, ...)``; an unknown name
        is an InputError before anything runs). The graph is not pruned per call: every
        output is still computed."""
        if output_names is not None:
            wanted, out = self._wanted(output_names), self.run(feeds, outputs, timeout=timeout)
            return {n: out[n] for n in wanted}
        if self._plain and timeout is None and not _BACKGROUND[0]:
            return self._runtime.run(feeds, outputs)
        if self._on_stand_in() or _BACKGROUND[0]:
            with in_call():
                return self._run(feeds, outputs, timeout)
        return self._run(feeds, outputs, timeout)

    def _plain_now(self) -> bool:
        """Whether calls may skip ``_run``: no default deadline, no limit, no split."""
        return self._timeout is None and self._limiter is None and self._rows is None

    def _on_stand_in(self) -> bool:
        """Whether a cold start's stand-in serves this model still (its warm-up yields to
        calls: ``concurrency.call_yield.in_call``, as background lowering does while
        ``_BACKGROUND[0]``). Once it switched (or failed to), calls without a deadline or
        a limit go straight to the executor again."""
        switched = self._switched
        if switched is None or switched.is_set():
            self._plain = self._plain_now()
            return False
        return True

    def _run(
        self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None,
        timeout: float | None,
    ) -> dict[str, np.ndarray]:  # fmt: skip
        """``run`` with a call context (a deadline) or a concurrency limit."""
        call = self._call(timeout)
        limiter = self._limiter
        held = None  # the limiter once its slot is ours
        try:
            if limiter is not None:
                if not limiter.acquire(_remaining(call)):
                    assert call is not None  # only a deadline ends the wait
                    raise call.deadline_error()
                held = limiter
            if self._rows is not None:
                got = self._rows.run(self._runtime, feeds, outputs, call)
                if got is not None:
                    return got
            if call is None:
                return self._runtime.run(feeds, outputs)
            return self._runtime.run_call(feeds, outputs, call)
        finally:
            _end_call(held, call)

    async def run_async(
        self,
        feeds: Mapping[str, Any],
        *,
        timeout: float | None = None,
        output_names: Sequence[str] | None = None,
        outputs: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """``run``, awaitable from asyncio, uvloop or trio code, never blocking the loop for
        longer than a hop to a worker would cost: a call the cost model calls cheaper than
        that runs inline, others on the host's pool (the async executor: cheap kernels on
        the loop, expensive ones on the pool). Cancelling the awaiting task stops the
        call's kernels (and a running Loop/Scan at its next iteration); past ``timeout``
        it raises DeadlineExceeded at once. With ``max_concurrency`` it first waits for a
        slot (first come, first served; cancellable). ``output_names``/``outputs``: ``run``'s."""
        if output_names is not None:
            wanted = self._wanted(output_names)
            out = await self.run_async(feeds, timeout=timeout, outputs=outputs)
            return {n: out[n] for n in wanted}
        if self._on_stand_in() or _BACKGROUND[0]:
            with in_call():
                return await self._run_async(feeds, timeout, outputs)
        return await self._run_async(feeds, timeout, outputs)

    async def _run_async(
        self, feeds: Mapping[str, Any], timeout: float | None,
        outputs: Mapping[str, np.ndarray] | None,
    ) -> dict[str, np.ndarray]:  # fmt: skip
        call = self._call(timeout)
        limiter = self._limiter
        held = None  # the limiter once its slot is ours
        try:
            if limiter is not None:
                await self._acquire(limiter, call)
                held = limiter
            if self._rows is not None:
                got = await self._rows.run_async(self._runtime, feeds, outputs, call)
                if got is not None:
                    return got
            return await self._runtime.run_async(feeds, call, outputs)
        finally:
            _end_call(held, call)

    def _wanted(self, output_names: Sequence[str]) -> list[str]:
        """``output_names`` checked against the model's outputs (InputError)."""
        if isinstance(output_names, (str, bytes)) or not all(
            isinstance(n, str) for n in output_names
        ):
            raise InputError(
                f"output_names must be a list of output names, got {output_names!r:.200}"
            )
        names = [o.name for o in self.outputs]
        unknown = [n for n in output_names if n not in names]
        if unknown:
            raise InputError(f"output_names: {unknown!r:.200} are not outputs of this model; "
                             f"its outputs: {names!r:.500}")  # fmt: skip
        return list(output_names)

    async def _acquire(self, limiter: Limiter, call: CallContext | None) -> None:
        """A grant of ``limiter``: at once when one is free (no timeout scope to set up:
        a served call's usual case), else waited for within ``call``'s deadline."""
        if limiter.try_acquire():
            return
        if call is None:
            await limiter.acquire_async()
            return
        import anyio

        with anyio.move_on_after(_remaining(call) or 0.0):
            await limiter.acquire_async()
            return
        raise call.deadline_error()

    def _call(self, timeout: float | None) -> CallContext | None:
        t = self._timeout if timeout is None else check_timeout(timeout)
        return None if t is None else CallContext(t)

    def run_batches(
        self,
        feeds: Iterable[Mapping[str, Any]],
        *,
        window: int | None = None,
        overlap: bool = True,
        timeout: float | None = None,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Bulk inference: results per batch, in order, computed as the iterator is consumed
        (on the consuming thread). A streamed model runs stage-major over windows of
        ``window`` batches, reading each stage's weights once per window while the previous
        stage computes (``overlap=False``: read, then compute); see ``tfrt_py.streaming``.
        Other models run each batch in turn. ``timeout`` bounds each batch."""
        rt = self._runtime
        if rt.name == "stream":
            return rt.run_batches(feeds, window=window, overlap=overlap)  # type: ignore[attr-defined]
        return (self.run(f, timeout=timeout) for f in feeds)

    async def run_batches_async(
        self,
        feeds: Any,
        *,
        window: int | None = None,
        overlap: bool = True,
        timeout: float | None = None,
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """``run_batches`` as an async iterator (``async for``); ``feeds`` may be an
        iterable or an async iterable. Streamed models compute stages on the host's pool."""
        rt = self._runtime
        if rt.name == "stream":
            async for r in rt.run_batches_async(feeds, window, overlap):  # type: ignore[attr-defined]
                yield r
            return
        if hasattr(feeds, "__aiter__"):
            async for f in feeds:
                yield await self.run_async(f, timeout=timeout)
        else:
            for f in feeds:
                yield await self.run_async(f, timeout=timeout)

    # -- warm-up ---------------------------------------------------------------------------
    def wait_compiled(self, timeout: float | None = None, *, native: bool = True) -> bool:
        """Block until this model runs on compiled code: the compiled kernels, when a cold
        process built it on NumPy paths (``load``'s ``native``), and (``native``) the native
        compiles started so far on the native tier. False on timeout (it serves meanwhile)."""
        t0 = time.monotonic()
        if not cold_start.await_switch(self._switched, timeout):
            return False
        tier = self.native if native else None  # after the switch: it may make the tier
        left = None if timeout is None else max(0.0, timeout - time.monotonic() + t0)
        return tier is None or bool(tier.wait(left))

    def _compiled_switch(self) -> Callable[[], None]:
        """Build this model's program on the compiled kernels now (cold_start's worker
        thread, inside ``compiled_gate.warming()``) and return what switches the model to
        it: cold_start runs that once the kernels are released, so no call runs the new
        program while the gate still holds the kernels back on callers' threads (there,
        its kernels would plan their shapes on NumPy paths, for good)."""
        runtime, prepared, apply = rebuild(self._runtime, self._prepared)

        def install() -> None:
            apply()
            self._runtime, self._prepared = runtime, prepared
            self.executor = runtime.name
            self._plain = self._plain_now()

        return install

    def warmup(self, signatures: Iterable[Mapping[str, Any]]) -> float:
        """Prepare these input signatures now (see ``load(warmup=)``); seconds taken.

        Each item maps every input name to a shape (a tuple or list of ints) or an example
        array. A shape's feed is zeros for float inputs and ones for integer and bool
        inputs (ids in range, masks that attend). Bad items raise ``InputError`` (as
        ``run`` would), before anything runs. On the native tier each signature is
        compiled (in signature mode: whether or not it is hot) and awaited, then called a
        few times, so the tier's measured choice is made here and not on a user's call.
        """
        t0 = time.perf_counter()
        feeds_list = [warmup_feeds(self.inputs, item) for item in signatures]
        cold_start.await_switch(self._switched, None)  # warm what serves from now on
        tier = self.native
        for feeds in feeds_list:
            self.run(feeds)
            if tier is not None:
                tier.warm(feeds)
        if tier is not None:
            tier.wait(None)
            for feeds in feeds_list:
                for _ in range(WARMUP_CALLS):
                    self.run(feeds)
        spent = time.perf_counter() - t0
        self._warmup = (self._warmup[0] + len(feeds_list), self._warmup[1] + spent)
        return spent

    def profile(self, feeds: Mapping[str, Any], repeat: int = 20) -> ProfileReport:
        """Where a call's time goes: ``repeat`` calls (after a warm-up) of this model's
        executor kind with every kernel timed; per node its op, input shapes, µs, share and
        GOP/s (float or integer operations), sorted (``print(report)``,
        ``report.save_trace("t.json")`` for Perfetto / chrome://tracing). A native model is
        profiled on the sync interpreter (its function runs the same nodes as one call; the
        report says how long it takes). A cold process first waits for the compiled kernels
        (``cold_start``). The model itself is not changed."""
        from .profiling import native_note, profile  # here: `import tfrt_py` skips the profiler

        cold_start.await_switch(self._switched, None)
        kind = self.executor
        if kind == "stream":
            raise ValueError("profile: streamed models are not profiled yet (time run_batches)")
        check, host = FeedChecker(self._prepared.graph.inputs), self._runtime.host

        def build(timed: Prepared) -> Executor:
            ex = "async" if kind == "async" else "sync"
            return select_executor(ex, timed, check, host=host, native_mode="background")

        report = profile(self._prepared, kind, build, feeds, repeat)
        if kind == "native":
            report.note = native_note(self._runtime, feeds, repeat)
        return report

    def memory_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        """The sync interpreter's MemoryPlan for feeds of these shapes (``arena_bytes``,
        ``lower_bound_bytes``, ``buffers``); made now, on zero feeds, if no call made it."""
        return self._runtime.memory_plan(shapes)

    def describe(self) -> str:
        """A human-readable summary: source, I/O, op histogram, weights (shared across
        forks or private: ``tfrt_py.sharing``), passes, cost, executor and why, memory
        plans, the run_async rule, and the fast paths this process runs and why any is off
        (``kernels.lib.features``)."""
        from .sharing import describe_lines as weight_lines

        ops = collections.Counter(
            f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in self._graph.walk()
        )
        n_params = sum(int(c.const.size) for c in self._graph.constants if c.const is not None)
        lines = [
            f"model: {self._origin}",
            f"  loaded in {self._load_s * 1e3:.1f} ms"
            + (f" ({self._obtained})" if self._obtained else ""),
            "  inputs:  " + ", ".join(str(s) for s in self.inputs),
            "  outputs: " + ", ".join(str(s) for s in self.outputs),
            f"  nodes: {len(self._graph.nodes)} ({sum(ops.values())} counting nested graphs), "
            f"constants: {len(self._graph.constants)} ({n_params:,} elements)",
            "  ops: " + ", ".join(f"{k} x{v}" for k, v in ops.most_common()),
            *weight_lines(self._graph),
            *self._prepared.describe_lines(),
            *self._runtime.describe_lines(),
            *self._runtime.describe_policy(),
            self._rows.describe() if self._rows else f"  rows: calls run whole ({self._rows_why})",
        ]
        lines.append(
            f"  threads: {thread_budget()} per call (split kernels on "
            f"{native_threads.runner()}"
            "; BLAS single-threaded)"
        )
        lines.append("  fast paths of this process:")
        from .kernels.lib.features import format_features  # (imports the integer gemm)

        lines += [f"    {line}" for line in format_features()]
        if self._switched is not None:
            lines.append(f"  {cold_start.describe()}")
        if self._warmup[0]:
            lines.append(f"  warmup: {self._warmup[0]} signature(s) in {self._warmup[1]:.2f} s")
        if self._timeout is not None:
            lines.append(f"  default deadline: {self._timeout:g} s per call")
        if self._limiter is not None:
            lines.append(f"  max_concurrency: {self._limiter.limit} calls in flight")
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.inputs)
        outs = ", ".join(str(s) for s in self.outputs)
        return f"<tfrt_py.Model {self._origin} ({ins}) -> ({outs}) executor={self.executor}>"


def _end_call(held: Limiter | None, call: CallContext | None) -> None:
    """A call's end, on every path: its limiter slot (if it got one) freed, then its
    deadline's timer stopped."""
    if held is not None:
        held.release()
    if call is not None:
        call.finish()


def _remaining(call: CallContext | None) -> float | None:
    """Seconds left before ``call``'s deadline (None: no deadline)."""
    if call is None or call.timeout is None:
        return None
    return max(0.0, call.deadline - time.monotonic())
