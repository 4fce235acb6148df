"""``model.profile(feeds, repeat=N)``: where a call's time goes, per node.

The profile runs the model's own executor kind (sync interpreter, async dataflow executor)
over a copy of its compiled program whose kernels are wrapped in a timer, so the figures
come from the same plans, the same ``out=`` buffers and the same threads as real calls
(a fused kernel's inline statements become a call while profiling: a few hundred ns). A
native model is timed as one call: its nodes are one numba function.

Each kernel call records (node index, thread, start, end) into the run's event list
(``list.append``: atomic, so the async executor's worker threads record without a lock).
The report aggregates the medians over ``repeat`` calls: per node its op, input shapes, µs,
share of the call, and GOP/s where the cost model knows the node's operations (float or
integer multiply-adds as two; priced on
the shapes the call really had); ``save_trace``
writes the last call's events in Chrome trace-event format (Perfetto, chrome://tracing),
one track per thread. Runs on the calling thread; the model is not changed.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .compiler.cost import cost_of_shapes
from .compiler.prepare import Prepared
from .executors.base import Executor
from .executors.program import Instr, Program
from .feeds import FeedChecker
from .records import record

__all__ = ["NodeProfile", "ProfileReport", "native_note", "profile"]

Event = tuple[int, int, int, int]  # (node index, thread id, start ns, end ns)


@record(frozen=True)
class NodeProfile:
    """One node's figures over the profiled calls (µs: median per call)."""

    name: str
    op: str
    shapes: str
    us: float
    share: float
    calls: int
    gflops: float | None


@record
class ProfileReport:
    """What ``Model.profile`` returns: per-node figures sorted by time, the call's median
    wall time, and the last call's events for a trace."""

    executor: str
    repeat: int
    call_us: float
    nodes: list[NodeProfile]
    events: list[tuple[str, str, int, int, int, str]]  # (name, op, thread, start, end, shapes)
    #: an extra line (a native model: its native call's time)
    note: str = ""

    def by_op(self) -> list[tuple[str, float, int]]:
        """(op, µs per call, nodes) summed per op type, slowest first."""
        acc: dict[str, list[float]] = {}
        for n in self.nodes:
            acc.setdefault(n.op, []).append(n.us)
        rows = [(op, sum(v), len(v)) for op, v in acc.items()]
        return sorted(rows, key=lambda r: -r[1])

    def table(self, top: int | None = None) -> str:
        """The report as text: per node, then per op."""
        nodes = self.nodes if top is None else self.nodes[:top]
        w = max([len(n.name) for n in nodes] + [4])
        lines = [
            f"profile: executor {self.executor}, {self.repeat} call(s), median "
            f"{self.call_us:,.1f} µs per call",
            f"{'node':<{w}}  {'op':<22} {'µs':>10} {'%':>6} {'GOP/s':>8}  input shapes",
        ]
        for n in nodes:
            gf = f"{n.gflops:8.2f}" if n.gflops is not None else f"{'':8}"
            lines.append(
                f"{n.name:<{w}}  {n.op:<22} {n.us:10.1f} {100 * n.share:6.1f} {gf}  {n.shapes}"
            )
        if top is not None and len(self.nodes) > top:
            lines.append(f"... {len(self.nodes) - top} more nodes")
        if self.note:
            lines.append(self.note)
        lines.append("by op:")
        total = sum(n.us for n in self.nodes) or 1.0
        for op, us, k in self.by_op():
            lines.append(f"  {op:<22} {us:10.1f} µs {100 * us / total:6.1f} %  ({k} nodes)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def trace(self) -> dict[str, Any]:
        """The last call's events as a Chrome trace (``traceEvents``, µs timestamps)."""
        t0 = min((e[3] for e in self.events), default=0)
        tids: dict[int, int] = {}
        events: list[dict[str, Any]] = []
        for name, op, tid, start, end, shapes in self.events:
            k = tids.setdefault(tid, len(tids))
            events.append({
                "name": name, "cat": op, "ph": "X", "pid": 1, "tid": k,
                "ts": (start - t0) / 1e3, "dur": (end - start) / 1e3,
                "args": {"op": op, "input_shapes": shapes},
            })  # fmt: skip
        for tid, k in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": k,
                           "args": {"name": _thread_name(tid)}})  # fmt: skip
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"executor": self.executor, "call_us": self.call_us}}  # fmt: skip

    def save_trace(self, path: str) -> None:
        """Write ``trace()`` as JSON (open it in Perfetto or chrome://tracing)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.trace(), f)

    def plot(self, path: str, top: int = 25) -> None:
        """A bar chart of the slowest nodes (needs matplotlib: ``pip install 'tfrt-py[bench]'``)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.nodes[:top][::-1]
        fig, ax = plt.subplots(figsize=(8, 0.6 + 0.32 * len(rows)))
        ax.barh([f"{n.name} ({n.op})" for n in rows], [n.us for n in rows], color="#4c72b0")
        ax.set_xlabel("µs per call (median)")
        ax.set_title(f"{self.executor}: {self.call_us:,.0f} µs per call")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _thread_name(tid: int) -> str:
    for t in threading.enumerate():
        if t.ident == tid:
            return t.name
    return f"thread {tid}"


def _timed_program(program: Program, sink: list[list[Event]]) -> Program:
    """A copy of ``program`` whose kernels record events into ``sink[-1]``."""

    def wrap(i: int, fn: Callable[..., Any]) -> Callable[..., Any]:
        now, ident = time.perf_counter_ns, threading.get_ident

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = now()
            try:
                return fn(*args, **kwargs)
            finally:
                sink[-1].append((i, ident(), t0, now()))

        return timed

    instrs = [
        Instr(wrap(i, ins.fn), ins.ins, ins.outs, ins.node, ins.flags)
        for i, ins in enumerate(program.instrs)
    ]
    return Program(program.graph, program.n_slots, program.template, instrs,
                   program.input_slots, program.capture_slots, program.output_slots)  # fmt: skip


def _shapes(args: list[Any]) -> str:
    return ", ".join(
        "x".join(map(str, a.shape)) if isinstance(a, np.ndarray) else type(a).__name__ for a in args
    )


def profile(
    prepared: Prepared,
    executor: str,
    build: Callable[[Prepared], Any],
    feeds: Mapping[str, Any],
    repeat: int,
) -> ProfileReport:
    """Profile ``repeat`` calls (after one warm-up call) of an executor built by
    ``build(prepared_with_timed_kernels)``; ``executor`` names the kind."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be a positive int, got {repeat!r}")
    sink: list[list[Event]] = [[]]
    timed = dataclasses.replace(prepared, program=_timed_program(prepared.program, sink))
    runner = build(timed)
    args = FeedChecker(prepared.graph.inputs)(feeds)
    shapes, flops = _observed(prepared, args)
    runner.run(feeds)  # warm-up: plans, first-call probe
    walls: list[float] = []
    per_call: list[list[Event]] = []
    for _ in range(repeat):
        sink.append([])
        t0 = time.perf_counter_ns()
        runner.run(feeds)
        walls.append((time.perf_counter_ns() - t0) / 1e3)
        per_call.append(sink[-1])
    return _report(prepared, executor, repeat, walls, per_call, shapes, flops)


def _observed(prepared: Prepared, args: list[Any]) -> tuple[dict[int, str], dict[int, float]]:
    """Each node's input shapes (text) and FLOPs, from the shapes of one plain run."""
    from .executors.plan_probe import run_env

    env = run_env(prepared.program, args)
    shapes: dict[int, str] = {}
    flops: dict[int, float] = {}
    for i, ins in enumerate(prepared.program.instrs):
        node = ins.node
        shapes[i] = _shapes([env[s] for s in ins.ins[: len(node.inputs)]])
        dims = [tuple(getattr(env[s], "shape", ())) for s in ins.ins[: len(node.inputs)]]
        outs = [tuple(getattr(env[s], "shape", ())) for s in ins.outs]
        flops[i] = cost_of_shapes(node, dims, outs, prepared.registry).flops
    return shapes, flops


def _report(
    prepared: Prepared,
    executor: str,
    repeat: int,
    walls: list[float],
    per_call: list[list[Event]],
    shapes: dict[int, str],
    flops: dict[int, float],
) -> ProfileReport:
    instrs = prepared.program.instrs
    times: dict[int, list[float]] = {i: [] for i in range(len(instrs))}
    for events in per_call:
        acc: dict[int, float] = {}
        for i, _, t0, t1 in events:
            acc[i] = acc.get(i, 0.0) + (t1 - t0) / 1e3
        for i in times:
            times[i].append(acc.get(i, 0.0))
    medians = {i: statistics.median(v) for i, v in times.items()}
    total = sum(medians.values()) or 1.0
    nodes = []
    for i, us in medians.items():
        node = instrs[i].node
        f = flops.get(i, 0.0)
        gflops = f / (us * 1e3) if f and us > 0 else None
        op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        nodes.append(NodeProfile(node.name, op, shapes.get(i, ""), us, us / total,
                                 len(per_call[-1]), gflops))  # fmt: skip
    nodes.sort(key=lambda n: -n.us)
    last = [
        (instrs[i].node.name, instrs[i].node.op_type, tid, t0, t1, shapes.get(i, ""))
        for i, tid, t0, t1 in per_call[-1]
    ]
    return ProfileReport(executor, repeat, statistics.median(walls), nodes, last)


def native_note(runtime: Executor, feeds: Mapping[str, Any], repeat: int) -> str:
    """The native function's own median µs per call, for a native model's profile."""
    tier: Any = runtime
    tier.wait(300)  # a profile is not a hot path: let a background compile finish
    if tier.state != "ready":
        return f"native: {tier.state}; the figures above are the sync interpreter's"
    walls = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter_ns()
        runtime.run(feeds)
        walls.append((time.perf_counter_ns() - t0) / 1e3)
    us = sorted(walls[1:])[len(walls[1:]) // 2]
    return (f"native: the model runs as one numba function, {us:,.1f} µs per call (median); "
            "the per-node figures above are the sync interpreter's")  # fmt: skip
