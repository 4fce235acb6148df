"""The dataflow executor under cancellation and concurrency: cancelling run_async (also
while a pool kernel runs), 100 concurrent run_async calls, 8 threads calling run, runs from
the host's own workers, and cheap kernels staying on their thread. Every test that runs a
model runs it on every executor and the results agree. No timing assertions.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest

import tfrt_py
from tests.support.dataflow import F32, Calls, N, _agree, _branchy, _wide
from tests.support.executors import load_on
from tests.support.threads import threads_disagreeing
from tfrt_py.concurrency import AsyncValue, HostContext
from tfrt_py.executors import compile_program
from tfrt_py.executors.dataflow import DataflowExecutor
from tfrt_py.ir import Graph, GraphBuilder, tensor_type
from tfrt_py.kernels import KernelContext, default_registry

# -- cancellation ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_cancelling_run_async_stops_scheduling(anyio_backend: Any, host: HostContext) -> None:
    calls = Calls()
    state: dict[str, Any] = {}

    async def block(x: np.ndarray) -> np.ndarray:
        if state["block"]:
            state["started"].set(None)
            try:
                await AsyncValue()  # never available
            finally:
                state["cancelled"].set(True)
        return x

    def after(x: np.ndarray) -> np.ndarray:
        calls.hit("after")
        return x + 1

    b = GraphBuilder("cancellable")
    x = b.input("x", F32, (2,))
    b.output(b.op("After", b.op("Block", x, domain="app"), domain="app"), "y")
    b.output(b.op("Relu", x), "r")
    kernels = {("app", "Block"): block, ("app", "After"): after}
    model = load_on("async", b.build(), host=host, custom_kernels=kernels)
    state.update(block=True, started=AsyncValue(), cancelled=AsyncValue())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(model.run_async, {"x": np.ones(2, F32)})
            await state["started"]
            tg.cancel_scope.cancel()
        assert await state["cancelled"] is True  # the async kernel was cancelled
    assert calls["after"] == 0  # nothing downstream was scheduled
    state["block"] = False
    out = await model.run_async({"x": np.ones(2, F32)})  # the model is still usable
    np.testing.assert_array_equal(out["y"], np.full(2, 2, F32))


@pytest.mark.anyio
async def test_cancel_while_a_pool_kernel_runs(anyio_backend: Any) -> None:
    calls = Calls()
    release = threading.Event()
    state: dict[str, Any] = {}

    def hold(x: np.ndarray) -> np.ndarray:
        if state["hold"]:
            state["started"].set(None)
            release.wait(timeout=10)
        return x * 2

    def after(x: np.ndarray) -> np.ndarray:
        calls.hit("after")
        return x + 1

    reg = default_registry().copy()
    reg.add("Hold", lambda ctx: hold, domain="app")
    reg.add("After", lambda ctx: after, domain="app")
    b = GraphBuilder("pool_cancel")
    x = b.input("x", F32, (2,))
    b.output(b.op("After", b.op("Hold", x, domain="app"), domain="app"), "y")
    df = DataflowExecutor(
        compile_program(b.build(), reg), reg, expensive=lambda n: n.op_type == "Hold"
    )
    with HostContext(num_workers=1, name="one-worker") as host:
        state.update(hold=True, started=AsyncValue())
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(df.run_async, [np.ones(2, F32)], host)
                await state["started"]  # Hold is running on the worker
                tg.cancel_scope.cancel()
            release.set()
            drained: AsyncValue[None] = AsyncValue()
            host.enqueue(drained.set, None)  # one worker, FIFO: runs after Hold's drain
            await drained
        assert calls["after"] == 0
        state["hold"] = False
        (y,) = await df.run_async([np.ones(2, F32)], host)
        np.testing.assert_array_equal(y, np.full(2, 3, F32))


# -- concurrency -----------------------------------------------------------------------------


def _jitter_model(is_async: bool) -> tuple[Graph, dict[tuple[str, str], Any]]:
    """An async kernel on one branch (yielding to the loop 0-3 times), an expensive kernel
    on each branch, cheap ops around them."""

    async def jitter_async(x: np.ndarray) -> np.ndarray:
        for _ in range(int(abs(x[0, 0]) * 10) % 4):
            await anyio.sleep(0)
        return x * F32(0.5)

    def jitter(x: np.ndarray) -> np.ndarray:
        return x * F32(0.5)

    rng = np.random.default_rng(5)
    b = GraphBuilder("jitter")
    x = b.input("x", F32, (1, N))
    jittered = b.op("Jitter", x, domain="app", output_types=[tensor_type(F32, (1, N))])
    left = _wide(b, jittered, rng)
    right = _wide(b, b.op("Relu", x), rng)
    b.output(b.op("Tanh", b.op("Add", left, right)), "y")
    return b.build(), {("app", "Jitter"): jitter_async if is_async else jitter}


def _inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.standard_normal((1, N)).astype(F32) for _ in range(n)]


@pytest.mark.anyio
async def test_100_concurrent_run_async_calls(
    anyio_backend: Any, executor: str, host: HostContext
) -> None:
    graph, kernels = _jitter_model(is_async=executor == "async")
    model = load_on(executor, graph, host=host, custom_kernels=kernels)
    ref_graph, ref_kernels = _jitter_model(is_async=False)
    ref = tfrt_py.load(ref_graph, executor="sync", custom_kernels=ref_kernels)
    xs = _inputs(100)
    results: dict[int, np.ndarray] = {}

    async def call(i: int) -> None:
        results[i] = (await model.run_async({"x": xs[i]}))["y"]

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(call, i)
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(results[i], ref.run({"x": x})["y"])


@pytest.mark.parametrize("with_async_kernel", [False, True])
def test_8_threads_call_run(executor: str, with_async_kernel: bool, host: HostContext) -> None:
    if with_async_kernel and executor != "async":
        pytest.skip(f"the {executor} executor refuses async kernels (test_dataflow.py)")
    graph, kernels = _jitter_model(is_async=with_async_kernel)
    model = load_on(executor, graph, host=host, custom_kernels=kernels)
    ref_graph, ref_kernels = _jitter_model(is_async=False)
    ref = tfrt_py.load(ref_graph, executor="sync", custom_kernels=ref_kernels)
    xs = _inputs(8)
    expected = [ref.run({"x": x})["y"] for x in xs]
    assert threads_disagreeing(lambda x: model.run({"x": x})["y"], xs, expected, calls=25) == []


def test_run_on_a_worker_of_the_same_host_does_not_wait_on_the_pool(
    executor: str, request: pytest.FixtureRequest
) -> None:
    graph = _branchy()
    x = np.ones((1, N), F32)
    expected = tfrt_py.load(graph, executor="sync").run({"x": x})
    with HostContext(num_workers=1, name="one-worker") as host:
        model = load_on(executor, graph, host=host)
        out: AsyncValue[dict[str, np.ndarray]] = AsyncValue()
        host.enqueue(lambda: out.set(model.run({"x": x})))  # the only worker calls run()
        _agree([expected, out.wait(timeout=30)])


@pytest.mark.anyio
async def test_cheap_kernels_never_cross_threads(anyio_backend: Any, host: HostContext) -> None:
    """E1 and E2 are expensive, c* cheap. From run(): the caller keeps one E, the pool gets
    the other; each E's cheap successors run on the thread that ran it. From run_async():
    the loop thread keeps no E."""
    seen: dict[str, int] = {}

    def probe(ctx: KernelContext) -> Any:
        tag = ctx.attr("tag")

        def fn(x: np.ndarray) -> np.ndarray:
            seen[tag] = threading.get_ident()
            return x + 1

        return fn

    reg = default_registry().copy()
    reg.add("Probe", probe, domain="t")
    b = GraphBuilder("threads")
    x = b.input("x", F32, (2,))
    heads = []
    for k in (1, 2):
        e = b.op("Probe", x, domain="t", tag=f"E{k}")
        heads.append(
            b.op("Probe", b.op("Probe", e, domain="t", tag=f"c{k}"), domain="t", tag=f"d{k}")
        )
    b.output(b.op("Add", *heads), "y")
    df = DataflowExecutor(
        compile_program(b.build(), reg),
        reg,
        expensive=lambda n: n.attrs.get("tag", "").startswith("E"),
    )

    def call() -> list[Any]:
        seen["caller"] = threading.get_ident()
        return df.run([np.zeros(2, F32)], host)

    (y,) = await anyio.to_thread.run_sync(call)
    np.testing.assert_array_equal(y, np.full(2, 6, F32))
    assert seen["E1"] != seen["E2"] and seen["caller"] in (seen["E1"], seen["E2"])
    for tag in "12":
        assert seen[f"c{tag}"] == seen[f"d{tag}"] == seen[f"E{tag}"]
    seen.clear()
    (y,) = await df.run_async([np.zeros(2, F32)], host)
    assert threading.get_ident() not in (seen["E1"], seen["E2"])
    for tag in "12":
        assert seen[f"c{tag}"] == seen[f"d{tag}"] == seen[f"E{tag}"]
