"""load() and Model: import -> verify -> choose executor -> compile; run and run_async.

Who owns what: a Model owns its IR graph, its compiled Program and, for the async
executor, the DataflowExecutor over that Program; all are immutable after load, so ``run``
may be called from many threads at once (each call owns its environment). The async
executor borrows a HostContext (the caller's, or ``default_host()``) for its worker pool and
event-loop bridge. ``run_async`` on the sync executor runs inline on the loop's thread; on
the async executor, cheap kernels run on the loop's thread and expensive ones in the pool.
"""

from __future__ import annotations

import collections
import inspect
import os
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .compiler.cost import graph_cost
from .compiler.prepare import Prepared, prepare
from .concurrency import HostContext, default_host
from .errors import UnsupportedOpError
from .executors.dataflow import DataflowExecutor
from .executors.dataflow_cost import is_expensive
from .executors.program import Program, compile_program, user_output
from .feeds import FeedChecker, TensorSpec, fill_outputs, spec_of
from .ir import Graph, Node, verify
from .kernels import KernelContext, KernelFlags, KernelRegistry, default_registry

__all__ = ["EXECUTORS", "Model", "load"]

#: The executors a caller may ask for. "auto" picks per model.
EXECUTORS = ("auto", "sync", "async", "native")
_AVAILABLE = ("sync", "async", "native")

CustomKernels = Mapping[tuple[str, str], Callable[..., Any]]


def load(
    source: Any,
    *,
    executor: str = "auto",
    custom_kernels: CustomKernels | None = None,
    host: HostContext | None = None,
    optimize: bool | Collection[str] | None = None,
    memory_budget: int | None = None,
    native: str = "background",
    base_dir: str | os.PathLike[str] | None = None,
) -> Model:
    """Load a model from a path, bytes, ``onnx.ModelProto`` or ``tfrt_py.ir.Graph``.

    Everything that can fail for a bad model fails here, not at the first call: an
    unreadable or malformed file, an unsupported op or opset (naming op, domain, opset and
    node), a malformed graph.

    ``executor="auto"`` picks "async" (the dataflow executor) when the model has ``async
    def`` kernels, else "sync". ``host`` is the HostContext the async executor runs on
    (default: ``tfrt_py.concurrency.default_host()``, created on first use).

    ``optimize`` picks the load-time passes: None/True all, False none, or a set of names
    from ``tfrt_py.compiler.PASSES``; ``$TFRT_PY_DISABLE_PASSES=a,b`` turns passes off.

    ``memory_budget`` (bytes): when the weights exceed it, external-data weights stream
    from disk by stage (executor "stream", see ``tfrt_py.streaming``); else a normal load.

    ``executor="native"`` (or "auto" for a tiny model whose ops all lower) compiles the
    model into one numba function (``tfrt_py.native``), cached on disk; ``native=
    "background"`` serves calls on the sync interpreter until it is compiled, ``"eager"``
    compiles before returning.

    ``base_dir``: the directory external-data locations are relative to, for a bytes or
    ``onnx.ModelProto`` source (required when it has external data; a path source uses its
    own directory, and ``base_dir`` may only repeat it). External data is only read from
    regular files inside that directory (docs/security_models.md).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if executor not in _AVAILABLE and executor != "auto":
        raise ValueError(
            f"executor {executor!r} is not available in this version of tfrt_py "
            f"(available: {', '.join(_AVAILABLE)}, or 'auto')"
        )
    if native not in ("background", "eager"):
        raise ValueError(f"native must be 'background' or 'eager', got {native!r}")
    t0 = time.perf_counter()
    registry = _with_custom(default_registry(), custom_kernels)
    if isinstance(source, Graph):
        if base_dir is not None:
            raise ValueError("base_dir is for ONNX sources; a tfrt_py.ir.Graph has no files")
        if memory_budget is not None:
            raise ValueError(
                "memory_budget streams ONNX external-data weights from disk; a tfrt_py.ir.Graph "
                "already holds its weights in memory (save it as ONNX with external data)"
            )
        graph, origin = source, f"graph {source.name!r}"
    else:
        from .frontends.onnx import import_model, read_model

        proto, base_dir = read_model(source, base_dir)
        origin = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "ONNX model"
        if memory_budget is not None:
            from .streaming import load_streamed

            streamed = load_streamed(
                proto, base_dir, memory_budget=memory_budget, origin=origin, registry=registry,
                optimize=optimize, host=host, executor=executor, t0=t0,
            )  # fmt: skip
            if streamed is not None:
                return streamed
        graph = import_model(proto, base_dir, registry.has)
    verify(graph)
    prepared = prepare(graph, registry, optimize)
    graph, registry = prepared.graph, prepared.registry
    program = compile_program(graph, registry)
    chosen, why = _choose_executor(executor, program, registry)
    lowered = None
    if chosen in ("sync", "native"):
        from .native.select import choose as choose_native

        chosen, why, lowered = choose_native(executor, chosen, why, program, registry)
    dataflow = DataflowExecutor(program, registry) if chosen == "async" else None
    load_s = time.perf_counter() - t0
    return Model(
        graph, program, chosen, origin, load_s,
        dataflow=dataflow, host=host, why=why, prepared=prepared,
        native=None if lowered is None else (lowered, native),
    )  # fmt: skip


def _choose_executor(requested: str, program: Program, registry: KernelRegistry) -> tuple[str, str]:
    """(executor, why). Async kernels must be top-level: nested graphs run synchronously."""
    top = {id(ins.node) for ins in program.instrs}
    for node in program.graph.walk():
        if id(node) in top or not registry.has(node.domain, node.op_type, node.opset):
            continue
        if registry.lookup(node.domain, node.op_type, node.opset).flags.is_async:
            raise UnsupportedOpError(
                node.op_type,
                node.domain,
                node.opset,
                node.name,
                "async kernels inside If/Loop/Scan bodies are not supported (nested graphs "
                "run synchronously)",
            )
    async_nodes = [ins.node for ins in program.instrs if ins.flags.is_async]
    if requested == "sync" and async_nodes:
        n = async_nodes[0]
        raise UnsupportedOpError(
            n.op_type,
            n.domain,
            n.opset,
            n.name,
            "async kernels need the async executor (executor='async' or 'auto')",
        )
    if requested != "auto":
        return requested, "requested"
    if async_nodes:
        return "async", f"auto: {len(async_nodes)} async kernel(s) to overlap"
    nodes = [ins.node for ins in program.instrs]
    total = graph_cost(program.graph, registry)
    pairs = _parallel_expensive(nodes, registry)
    if pairs:
        a, b = pairs
        return "async", (
            f"auto: expensive kernels {a!r} and {b!r} can run in parallel "
            f"(est. {total.flops / 1e6:.1f} MFLOP per call)"
        )
    return "sync", (
        f"auto: no async kernels and no parallel expensive kernels "
        f"(est. {total.flops / 1e6:.2f} MFLOP per call): the pool hop would cost more"
    )


def _parallel_expensive(nodes: list[Node], registry: KernelRegistry) -> tuple[str, str] | None:
    """Two expensive kernels with no path between them (names), or None. "Expensive" is
    the dataflow executor's own classification, so the choice and its scheduling agree.

    Load time only: an ancestor bitset per value over the expensive nodes seen so far.
    """
    expensive = {id(n) for n in nodes if is_expensive(n, registry)}
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


def _with_custom(base: KernelRegistry, custom: CustomKernels | None) -> KernelRegistry:
    if not custom:
        return base
    reg = base.copy()
    for key, fn in custom.items():
        if not (isinstance(key, tuple) and len(key) == 2 and callable(fn)):
            raise ValueError(
                f"custom_kernels maps (domain, op_type) tuples to callables, got {key!r}: {fn!r}"
            )
        domain, op_type = key
        is_async = inspect.iscoroutinefunction(fn)
        reg.add(
            op_type,
            _custom_builder(fn, is_async),
            domain=domain,
            flags=KernelFlags(pure=False, is_async=is_async),
        )
    return reg


def _custom_builder(fn: Callable[..., Any], is_async: bool) -> Callable[[KernelContext], Any]:
    def build(ctx: KernelContext) -> Any:
        attrs = dict(ctx.attrs)
        n_out = ctx.n_outputs
        if is_async:
            if not attrs and n_out == 1:
                return fn

            async def call_async(*xs: Any) -> Any:
                r = await fn(*xs, **attrs)
                return r if n_out == 1 else tuple(r)

            return call_async
        if not attrs:
            if n_out == 1:
                return fn
            return lambda *xs: tuple(fn(*xs))

        def call(*xs: Any) -> Any:
            r = fn(*xs, **attrs)
            return r if n_out == 1 else tuple(r)

        return call

    return build


class Model:
    """A loaded model. Create with ``tfrt_py.load``.

    ``inputs``/``outputs`` are TensorSpecs; ``executor`` names the executor serving it.
    Thread-safe: ``run`` may be called from many threads at once.
    """

    def __init__(
        self,
        graph: Graph,
        program: Program,
        executor: str,
        origin: str,
        load_s: float,
        *,
        dataflow: DataflowExecutor | None = None,
        host: HostContext | None = None,
        why: str = "requested",
        prepared: Prepared | None = None,
        stream: Any = None,
        native: Any = None,
    ) -> None:
        self._graph = graph
        # A tfrt_py.streaming.StreamedProgram when the weights stream from disk, else None.
        self._stream = stream
        self._program = program
        self.executor = executor
        self._origin = origin
        self._load_s = load_s
        self.inputs: list[TensorSpec] = [spec_of(v) for v in graph.inputs if v.default is None]
        #: Initializers a call may override by feeding them (ONNX IR >= 4 graph inputs that
        #: have an initializer; onnxruntime's get_overridable_initializers).
        self.overridable_initializers = [spec_of(v) for v in graph.inputs if v.default is not None]
        self.outputs: list[TensorSpec] = [spec_of(v) for v in graph.outputs]
        self._check = FeedChecker(graph.inputs)
        self._out_names = [s.name for s in self.outputs]
        self._out_types = [v.type for v in graph.outputs]
        # Outputs that are constants or feeds are always copied: the user owns what they get.
        fixed = {id(v) for v in graph.inputs} | {id(v) for v in graph.constants}
        self._out_fixed = [id(v) in fixed or v.is_const for v in graph.outputs]
        # The async executor over the same Program; None: run the Program directly.
        self._dataflow = dataflow
        self._host = host
        self._why = why
        # The sync interpreter: per-signature memory plans and generated straight-line code.
        self._prepared = prepared
        self._interp = (
            prepared.interpreter(program, self._check)
            if prepared is not None and executor == "sync"
            else None
        )
        # The native tier: (lowered module, mode); it serves on its own interpreter until
        # the compiled function is ready (tfrt_py.native.tier).
        self._native: Any = None
        if native is not None and prepared is not None:
            from .native.tier import NativeTier

            interp = prepared.interpreter(program, self._check)
            self._native = NativeTier(native[0], program, self._check, interp, mode=native[1])

    @property
    def graph(self) -> Graph:
        """The IR graph this model runs (read-only)."""
        return self._graph

    @property
    def native(self) -> Any:
        """The native tier (``tfrt_py.native.tier.NativeTier``: ``state``, ``wait()``,
        ``compiled``) when the model runs on executor "native", else None."""
        return self._native

    def run(
        self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model on ``feeds`` (input name -> array); outputs by name, in
        ``model.outputs`` order. Raises InputError for bad feeds, ExecutionError naming the
        node for a kernel failure; the model stays usable either way.

        ``outputs`` (name -> array of the output's shape and dtype) are filled in place and
        returned; other outputs are fresh arrays the caller owns."""
        interp = self._interp
        if interp is not None:
            return interp.run(feeds, outputs)
        native = self._native
        if native is not None:
            return native.run(feeds, outputs)
        if self._stream is not None:
            return self._stream.run(feeds, outputs)
        if outputs is not None:
            return fill_outputs(self.run(feeds), outputs)
        args = self._check(feeds)
        df = self._dataflow
        if df is None:
            results = self._program.run(args)
        else:
            results = df.run(args, self._host or default_host())
        return self._to_user(results)

    def _to_user(self, results: list[Any]) -> dict[str, np.ndarray]:
        out: dict[str, Any] = {}
        for name, ty, fixed, v in zip(self._out_names, self._out_types, self._out_fixed, results):
            if fixed and isinstance(v, np.ndarray):
                v = v.copy()
            out[name] = user_output(v, ty)
        return out

    async def run_async(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The same as ``run``, awaitable from asyncio, uvloop or trio code; cancellable.

        Sync executor: the program runs inline on the loop's thread (right for tiny models).
        Async executor: cheap kernels run on the loop's thread, expensive ones in the host's
        pool, async kernels as tasks of this loop; cancelling the awaiting task stops
        scheduling further kernels.
        """
        if self._stream is not None:
            return await self._stream.run_async(feeds)
        df = self._dataflow
        if df is None:
            return self.run(feeds)
        args = self._check(feeds)
        return self._to_user(await df.run_async(args, self._host or default_host()))

    def run_batches(
        self,
        feeds: Iterable[Mapping[str, Any]],
        *,
        window: int | None = None,
        overlap: bool = True,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Bulk inference: results per batch, in order, computed as the iterator is consumed
        (on the consuming thread). A streamed model runs stage-major over windows of
        ``window`` batches, reading each stage's weights once per window while the previous
        stage computes (``overlap=False``: read, then compute); see ``tfrt_py.streaming``.
        Other models run each batch in turn."""
        if self._stream is not None:
            return self._stream.run_batches(feeds, window, overlap)
        return (self.run(f) for f in feeds)

    def run_batches_async(
        self, feeds: Any, *, window: int | None = None, overlap: bool = True
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """``run_batches`` as an async iterator (``async for``); ``feeds`` may be an iterable
        or an async iterable. Streamed models compute stages on the host's pool."""
        from .streaming import run_each_async

        if self._stream is not None:
            return self._stream.run_batches_async(feeds, window, overlap)
        return run_each_async(self, feeds)

    def memory_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        """The sync interpreter's MemoryPlan for feeds of these shapes (``arena_bytes``,
        ``lower_bound_bytes``, ``buffers``); made now, on zero feeds, if no call made it."""
        interp = self._interp or (self._native.interp if self._native is not None else None)
        if interp is None:
            raise ValueError(f"memory plans belong to the sync executor; this model runs "
                             f"on {self.executor!r}")  # fmt: skip
        return interp.memory_plan(shapes)

    def describe(self) -> str:
        """A human-readable summary: source, I/O, op histogram, executor and why."""
        ops = collections.Counter(
            f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in self._graph.walk()
        )
        n_params = sum(int(c.const.size) for c in self._graph.constants if c.const is not None)
        lines = [
            f"model: {self._origin}",
            f"  loaded in {self._load_s * 1e3:.1f} ms",
            "  inputs:  " + ", ".join(str(s) for s in self.inputs),
            "  outputs: " + ", ".join(str(s) for s in self.outputs),
            f"  nodes: {len(self._graph.nodes)} ({sum(ops.values())} counting nested graphs), "
            f"constants: {len(self._graph.constants)} ({n_params:,} elements)",
            "  ops: " + ", ".join(f"{k} x{v}" for k, v in ops.most_common()),
        ]
        if self._prepared is not None:
            native = self._native
            lines += self._prepared.describe_lines(
                self._interp or (native.interp if native is not None else None)
            )
            if native is not None:
                lines.append("  " + native.describe())
            else:
                from .native.select import unused_reason

                reason = unused_reason(self._graph, self._prepared.registry)
                lines.append(f"  native tier: not used: {reason}")
        if self._dataflow is None:
            if self._native is not None:
                how = "the whole model as one numba function, the sync interpreter until compiled"
            elif self._interp is not None:
                how = "straight-line code generated per input signature over a memory plan"
            else:
                how = "topological-order interpreter over a prepared program"
            lines.append(f"  executor: {self.executor} ({self._why}; {how})")
        else:
            lines.append(f"  executor: {self.executor} ({self._why}; {self._dataflow.describe()})")
        if self._stream is not None:
            lines += self._stream.describe_lines()
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.inputs)
        outs = ", ".join(str(s) for s in self.outputs)
        return f"<tfrt_py.Model {self._origin} ({ins}) -> ({outs}) executor={self.executor}>"
