"""load() and Model: import -> verify -> choose executor -> compile; run and run_async.

Who owns what: a Model owns its IR graph and its compiled Program; both are immutable
after load, so ``run`` may be called from many threads at once (each call owns its
environment). ``run_async`` runs on the calling event loop's thread.
"""

from __future__ import annotations

import collections
import inspect
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .executors.program import Program, compile_program, user_output
from .feeds import FeedChecker, TensorSpec, spec_of
from .ir import Graph, verify
from .kernels import KernelContext, KernelFlags, KernelRegistry, default_registry

__all__ = ["EXECUTORS", "Model", "load"]

#: The executors a caller may ask for. "auto" picks per model.
EXECUTORS = ("auto", "sync", "async", "native")
_AVAILABLE = ("sync",)

CustomKernels = Mapping[tuple[str, str], Callable[..., Any]]


def load(
    source: Any,
    *,
    executor: str = "auto",
    custom_kernels: CustomKernels | None = None,
) -> Model:
    """Load a model from a path, bytes, ``onnx.ModelProto`` or ``tfrt_py.ir.Graph``.

    Everything that can fail for a bad model fails here, not at the first call: an
    unreadable or malformed file, an unsupported op or opset (naming op, domain, opset and
    node), a malformed graph.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if executor not in _AVAILABLE and executor != "auto":
        raise ValueError(
            f"executor {executor!r} is not available in this version of tfrt_py "
            f"(available: {', '.join(_AVAILABLE)}, or 'auto')"
        )
    t0 = time.perf_counter()
    registry = _with_custom(default_registry(), custom_kernels)
    if isinstance(source, Graph):
        graph, origin = source, f"graph {source.name!r}"
    else:
        from .frontends.onnx import import_model, read_model

        proto, base_dir = read_model(source)
        graph = import_model(proto, base_dir, registry.has)
        origin = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "ONNX model"
    verify(graph)
    program = compile_program(graph, registry)
    return Model(graph, program, "sync", origin, time.perf_counter() - t0)


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
        if is_async:
            raise ctx.unsupported(
                "async custom kernels need the async executor, not available in this version"
            )
        attrs = dict(ctx.attrs)
        n_out = ctx.n_outputs
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
        self, graph: Graph, program: Program, executor: str, origin: str, load_s: float
    ) -> None:
        self._graph = graph
        self._program = program
        self.executor = executor
        self._origin = origin
        self._load_s = load_s
        self.inputs: list[TensorSpec] = [spec_of(v) for v in graph.inputs]
        self.outputs: list[TensorSpec] = [spec_of(v) for v in graph.outputs]
        self._check = FeedChecker(graph.inputs)
        self._out_names = [s.name for s in self.outputs]
        self._out_types = [v.type for v in graph.outputs]
        # Outputs that are constants or feeds are always copied: the user owns what they get.
        fixed = {id(v) for v in graph.inputs} | {id(v) for v in graph.constants}
        self._out_fixed = [id(v) in fixed or v.is_const for v in graph.outputs]

    @property
    def graph(self) -> Graph:
        """The IR graph this model runs (read-only)."""
        return self._graph

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the model on ``feeds`` (input name -> array); outputs by name, in
        ``model.outputs`` order. Raises InputError for bad feeds, ExecutionError naming the
        node for a kernel failure; the model stays usable either way."""
        args = self._check(feeds)
        results = self._program.run(args)
        out: dict[str, Any] = {}
        for name, ty, fixed, v in zip(self._out_names, self._out_types, self._out_fixed, results):
            if fixed and isinstance(v, np.ndarray):
                v = v.copy()
            out[name] = user_output(v, ty)
        return out

    async def run_async(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The same as ``run``, awaitable from asyncio, uvloop or trio code.

        In this version the program runs inline on the loop's thread (right for tiny
        models); the dataflow executor will overlap async kernels and the pool.
        """
        return self.run(feeds)

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
            f"  executor: {self.executor} (topological-order interpreter over a prepared "
            "program; the only executor in this version)",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.inputs)
        outs = ", ".join(str(s) for s in self.outputs)
        return f"<tfrt_py.Model {self._origin} ({ins}) -> ({outs}) executor={self.executor}>"
