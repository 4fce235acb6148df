"""What the async machinery costs, and what it buys.

    python benchmarks/async_overhead.py [--quick]

Prints, as medians over interleaved bursts (µs):

1. AsyncValue: ``and_then`` + ``set``; ``and_then`` on an available value.
2. Awaiting an AsyncValue on asyncio, uvloop and trio -- available, pending and set by a
   loop callback, pending and set from a worker thread -- through tfrt_py's per-loop path
   and through an anyio bridge (``anyio.Event`` + ``anyio.from_thread``), with the loop's
   own hop as the floor. This is the measurement behind the choice in ``async_value``.
3. Dataflow overhead per cheap kernel: a 128-node chain (Relu, then Add) on a [1,16] tensor,
   the dataflow executor against the topological-order loop (``Program.run``) over the
   same compiled program.
4. Overlap: one branch awaits an async kernel sleeping 50 ms, a parallel branch computes
   ~50 ms of NumPy; sequential would be ~100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import numpy as np
import trio
import uvloop

import tfrt_py
from tfrt_py.compiler import model_cost
from tfrt_py.concurrency import (
    AsyncioBridge,
    AsyncValue,
    HostContext,
    current_bridge,
    make_available,
)
from tfrt_py.executors import compile_program
from tfrt_py.executors.dataflow import DataflowExecutor
from tfrt_py.ir import GraphBuilder
from tfrt_py.kernels import default_registry

F32 = np.float32
BURSTS = 15


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _bench(fn: Callable[[int], None], n: int, bursts: int) -> float:
    """µs per op: ``fn(n)`` does n ops; median over bursts."""
    out = []
    for _ in range(bursts):
        t0 = time.perf_counter()
        fn(n)
        out.append((time.perf_counter() - t0) / n)
    return _median_us(out)


# -- 1. AsyncValue -------------------------------------------------------------------------------


def bench_async_value(bursts: int) -> None:
    def noop() -> None:
        pass

    def and_then_set(n: int) -> None:
        for _ in range(n):
            av: AsyncValue[int] = AsyncValue()
            av.and_then(noop)
            av.set(1)

    def and_then_available(n: int) -> None:
        av = make_available(1)
        for _ in range(n):
            av.and_then(noop)

    print("1. AsyncValue (µs per op)")
    print(f"   AsyncValue() + and_then + set        {_bench(and_then_set, 20000, bursts):7.2f}")
    print(
        f"   and_then on an available value       {_bench(and_then_available, 20000, bursts):7.2f}"
    )


# -- 2. awaiting ---------------------------------------------------------------------------------


async def _await_via_anyio(av: AsyncValue[Any]) -> Any:
    """The alternative bridge: an anyio.Event, set through anyio.from_thread off-loop."""
    if not av.is_available():
        event = anyio.Event()
        token = anyio.lowlevel.current_token()
        tid = threading.get_ident()

        def wake() -> None:
            if threading.get_ident() == tid:
                event.set()
            else:  # blocks the setting thread until the loop has run event.set
                anyio.from_thread.run_sync(event.set, token=token)

        av.and_then(wake)
        await event.wait()
    return av.value


def _floors(bridge: Any, host: HostContext) -> tuple[Any, Any]:
    """The same park-and-wake with no AsyncValue: an asyncio Future, or trio's
    wait_task_rescheduled, woken by a loop callback (``on``) or by a worker (``off``)."""
    if isinstance(bridge, AsyncioBridge):
        loop = bridge.loop

        async def on() -> None:
            fut = loop.create_future()
            loop.call_soon(fut.set_result, None)
            await fut

        async def off() -> None:
            fut = loop.create_future()
            host.enqueue(loop.call_soon_threadsafe, fut.set_result, None)
            await fut

        return on, off
    low = trio.lowlevel

    def abort(_: Any) -> Any:
        return low.Abort.SUCCEEDED

    async def on_trio() -> None:
        bridge.call_soon(low.reschedule, low.current_task())
        await low.wait_task_rescheduled(abort)

    async def off_trio() -> None:
        host.enqueue(bridge.call_soon, low.reschedule, low.current_task())
        await low.wait_task_rescheduled(abort)

    return on_trio, off_trio


async def _await_cases(host: HostContext, n: int, bursts: int) -> dict[str, float]:
    bridge = current_bridge()
    assert bridge is not None
    res: dict[str, list[float]] = {}

    async def timed(name: str, one: Callable[[], Any], count: int) -> None:
        t0 = time.perf_counter()
        for _ in range(count):
            await one()
        res.setdefault(name, []).append((time.perf_counter() - t0) / count)

    def on_loop(av: AsyncValue[int]) -> AsyncValue[int]:
        bridge.call_soon(av.set, 1)
        return av

    def off_loop(av: AsyncValue[int]) -> AsyncValue[int]:
        host.enqueue(av.set, 1)
        return av

    ready = make_available(1)

    async def available() -> None:
        await ready

    async def pending_loop() -> None:
        await on_loop(AsyncValue())

    async def pending_loop_anyio() -> None:
        await _await_via_anyio(on_loop(AsyncValue()))

    async def pending_thread() -> None:
        await off_loop(AsyncValue())

    async def pending_thread_anyio() -> None:
        await _await_via_anyio(off_loop(AsyncValue()))

    floor_on, floor_off = _floors(bridge, host)

    for _ in range(bursts):
        await timed("available", available, n * 10)
        await timed("pending, set on loop", pending_loop, n)
        await timed("  [anyio bridge]", pending_loop_anyio, n)
        await timed("  [floor: the loop's own park+wake]", floor_on, n)
        await timed("pending, set by worker", pending_thread, n // 10)
        await timed("  [anyio bridge] ", pending_thread_anyio, n // 10)
        await timed("  [floor: the loop's own park+wake] ", floor_off, n // 10)
    return {k: _median_us(v) for k, v in res.items()}


def bench_await(host: HostContext, quick: bool) -> None:
    n, bursts = (200, 5) if quick else (1000, BURSTS)
    runs: dict[str, dict[str, float]] = {
        "asyncio": asyncio.run(_await_cases(host, n, bursts)),
        "uvloop": uvloop.run(_await_cases(host, n, bursts)),
        "trio": trio.run(_await_cases, host, n, bursts),
    }
    print("2. await AsyncValue (µs per await); [anyio bridge]: anyio.Event + anyio.from_thread")
    print(f"   {'':34}" + "".join(f"{k:>10}" for k in runs))
    for case in runs["asyncio"]:
        print(f"   {case:34}" + "".join(f"{runs[k][case]:10.2f}" for k in runs))


# -- 3. dataflow overhead per cheap kernel ------------------------------------------------------


def _chain(op: str, n: int = 128) -> tfrt_py.ir.Graph:
    b = GraphBuilder(f"{op.lower()}_chain")
    x = b.input("x", F32, (1, 16))
    c = b.const(np.full((1, 16), 1e-3, F32))
    h = x
    for _ in range(n):
        h = b.op(op, h) if op == "Relu" else b.op(op, h, c)
    b.output(h, "y")
    return b.build()


def _repeat(fn: Callable[[], object], n: int) -> None:
    for _ in range(n):
        fn()


def bench_chain(host: HostContext, quick: bool) -> None:
    """The executors over one compiled Program (no load-time passes: fusion would merge the
    chain into one kernel), so the difference is the run loop alone."""
    bursts, calls = (7, 100) if quick else (BURSTS, 300)
    x = [np.random.default_rng(0).standard_normal((1, 16)).astype(F32)]
    reg = default_registry()
    print("3. run-loop overhead on a 128-node chain, [1,16] float32 (µs per call)")
    print(f"   {'op':6}{'topological':>13}{'dataflow run':>14}{'run_async':>11}{'per kernel':>12}")
    for op in ("Relu", "Add"):
        program = compile_program(_chain(op), reg)
        dflow = DataflowExecutor(program, reg, expensive=model_cost(program.graph).expensive)
        loop = asyncio.new_event_loop()

        def run_async(n: int, df: DataflowExecutor = dflow, loop: Any = loop) -> None:
            async def many() -> None:
                for _ in range(n):
                    await df.run_async(x, host)

            loop.run_until_complete(many())

        times: dict[str, list[float]] = {"topo": [], "run": [], "await": []}
        for _ in range(bursts):  # interleaved
            for name, fn in (
                ("topo", functools.partial(_repeat, functools.partial(program.run, x))),
                ("run", functools.partial(_repeat, functools.partial(dflow.run, x, host))),
                ("await", run_async),
            ):
                t0 = time.perf_counter()
                fn(calls)
                times[name].append((time.perf_counter() - t0) / calls)
        loop.close()
        t, r, w = (_median_us(times[k]) for k in ("topo", "run", "await"))
        print(f"   {op:6}{t:13.1f}{r:14.1f}{w:11.1f}{(r - t) / 128:12.3f}")


# -- 4. overlap ----------------------------------------------------------------------------------


def _overlap_model(k: int, host: HostContext) -> tuple[tfrt_py.Model, tfrt_py.Model]:
    """y = Fetch(x) (an async kernel sleeping 50 ms) + ReduceMean of k MatMuls 512x512.
    Returns (the model, its NumPy branch alone on the sync executor)."""

    async def fetch(x: np.ndarray) -> np.ndarray:
        await anyio.sleep(0.05)
        return x

    rng = np.random.default_rng(1)
    w = (rng.standard_normal((512, 512)) / 23).astype(F32)

    def build(with_fetch: bool) -> tfrt_py.ir.Graph:
        b = GraphBuilder("overlap")
        x = b.input("x", F32, (1, 1)) if with_fetch else None
        a = b.input("a", F32, (512, 512))
        h = a
        for _ in range(k):
            h = b.op("MatMul", h, b.const(w))  # expensive: a 262144-element weight
        mean = b.op("ReduceMean", h, keepdims=1)
        b.output(b.op("Add", b.op("Fetch", x, domain="app"), mean) if with_fetch else mean, "y")
        return b.build()

    model = tfrt_py.load(build(True), custom_kernels={("app", "Fetch"): fetch}, host=host)
    return model, tfrt_py.load(build(False), executor="sync")


def bench_overlap(host: HostContext, quick: bool) -> None:
    feeds = {"x": np.ones((1, 1), F32), "a": np.eye(512, dtype=F32)}
    reps = 3 if quick else 7

    def ms(fn: Callable[[], Any], reps: int = reps) -> float:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return statistics.median(out) * 1e3

    k = 8  # calibrate the NumPy branch to ~50 ms on this machine, now
    for _ in range(3):
        _, probe = _overlap_model(k, host)
        k = max(1, round(k * 50.0 / ms(functools.partial(probe.run, {"a": feeds["a"]}), 5)))
    model, numpy_only = _overlap_model(k, host)

    cases: list[tuple[str, Callable[[], Any]]] = [
        ("NumPy branch alone (sync executor)", lambda: numpy_only.run({"a": feeds["a"]})),
        ("whole model, run() from sync code", lambda: model.run(feeds)),
        ("whole model, run_async() on asyncio", lambda: asyncio.run(model.run_async(feeds))),
        ("whole model, run_async() on uvloop", lambda: uvloop.run(model.run_async(feeds))),
        ("whole model, run_async() on trio", lambda: trio.run(model.run_async, feeds)),
    ]
    print(f"4. overlap: async kernel sleeping 50 ms || {k} x MatMul 512x512 (ms per call)")
    for label, fn in cases:
        print(f"   {label:42}{ms(fn):7.1f}")
    print("   (run one after the other, the two branches would take the NumPy branch + 50 ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    quick = ap.parse_args().quick
    with HostContext(name="bench") as host:
        print(f"host: {host.num_workers} workers\n")
        bench_async_value(5 if quick else BURSTS)
        print()
        bench_await(host, quick)
        print()
        bench_chain(host, quick)
        print()
        bench_overlap(host, quick)


if __name__ == "__main__":
    main()
