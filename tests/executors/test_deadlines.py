"""Deadlines, cancellation and the in-flight bound (issue 16), on every executor.

A runaway Loop (trip count 2^62 from a feed) is stopped by ``timeout=`` between its
iterations; a long kernel by the check before the next kernel; cancelling the task that
awaits ``run_async`` stops the Loop's iterations (observed through a counting custom
kernel in its body); ``max_concurrency`` bounds the calls in flight (observed with a
kernel that blocks on an event). After each, the model answers the next call correctly.
No test asserts a duration: waits are generous upper bounds on a hang.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.executors import load_on
from tests.support.paths import ROOT
from tfrt_py.errors import DeadlineExceeded

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
RUNAWAY = np.array(2**62, np.int64)


def _info(name: str, dtype: int, shape: Any) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


def _loop_model(body_op: str = "Neg") -> bytes:
    """y = Loop(n, true, x) with body v -> body_op(v) (or app::Count(v) counting calls)."""
    domain = "app" if body_op == "Count" else ""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node(body_op, ["v_in"], ["v_out"], domain=domain),
        ],
        "body",
        [_info("i", I64, []), _info("cond_in", TensorProto.BOOL, []), _info("v_in", F32, [2])],
        [_info("cond_out", TensorProto.BOOL, []), _info("v_out", F32, [2])],
    )
    loop = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="the_loop")
    graph = helper.make_graph([loop], "runaway", [_info("n", I64, []), _info("x", F32, [2])],
                              [_info("y", F32, [2])])  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("app", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


X = np.array([1.0, -2.0], np.float32)


def _feeds(n: Any) -> dict[str, Any]:
    return {"n": np.asarray(n, np.int64), "x": X}


def test_runaway_loop_raises_deadline_exceeded_and_the_model_stays_usable(executor: str) -> None:
    model = load_on(executor, _loop_model())
    with pytest.raises(DeadlineExceeded, match="the_loop") as info:
        model.run(_feeds(RUNAWAY), timeout=0.3)
    assert isinstance(info.value, TimeoutError)
    assert info.value.node_name == "the_loop" and info.value.op_type == "Loop"
    np.testing.assert_array_equal(model.run(_feeds(3))["y"], -X)  # odd trips: negated
    with pytest.raises(DeadlineExceeded):  # again, on the planned path
        model.run(_feeds(RUNAWAY), timeout=0.2)
    np.testing.assert_array_equal(model.run(_feeds(4))["y"], X)


def test_default_deadline_from_load(executor: str) -> None:
    model = load_on(executor, _loop_model(), timeout=0.2)
    with pytest.raises(DeadlineExceeded):
        model.run(_feeds(RUNAWAY))
    np.testing.assert_array_equal(model.run(_feeds(1))["y"], -X)
    assert "default deadline: 0.2 s" in model.describe()


@pytest.mark.anyio
async def test_runaway_loop_run_async_deadline(executor: str, anyio_backend: Any) -> None:
    model = load_on(executor, _loop_model())
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        with pytest.raises(DeadlineExceeded):
            await model.run_async(_feeds(RUNAWAY), timeout=0.3)
        tg.cancel_scope.cancel()
    assert ticks > 0  # the loop kept running other tasks meanwhile
    np.testing.assert_array_equal((await model.run_async(_feeds(2)))["y"], X)


def test_deadline_during_a_long_kernel_stops_the_call_naming_a_node(executor: str) -> None:
    """A kernel is never interrupted. The sync executor notices the deadline at its check
    before the next kernel and names that one; the async executor wakes the caller at the
    deadline, naming the first unfinished kernel (``DataflowExecutor.run``)."""

    def slow(x: np.ndarray) -> np.ndarray:
        time.sleep(0.4)
        return x + 1

    nodes = [
        helper.make_node("Slow", ["x"], ["a"], domain="app", name="slow"),
        helper.make_node("Relu", ["a"], ["y"], name="after_slow"),
    ]
    graph = helper.make_graph(nodes, "g", [_info("x", F32, [2])], [_info("y", F32, [2])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("app", 1)]
    data = helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()
    model = load_on(executor, data, custom_kernels={("app", "Slow"): slow})
    model.run({"x": X})  # plan the signature first: the deadline then hits the planned code
    with pytest.raises(DeadlineExceeded) as info:
        model.run({"x": X}, timeout=0.1)
    assert info.value.node_name == ("slow" if executor == "async" else "after_slow")
    np.testing.assert_array_equal(model.run({"x": X}, timeout=5)["y"], np.maximum(X + 1, 0))


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "1", True])
def test_bad_timeouts_are_value_errors(bad: Any) -> None:
    model = tfrt_py.load(_loop_model(), executor="sync")
    with pytest.raises(ValueError, match="timeout"):
        model.run(_feeds(1), timeout=bad)
    with pytest.raises(ValueError, match="timeout"):
        tfrt_py.load(_loop_model(), timeout=bad)


class _Counter:
    """A custom kernel counting its calls (the Loop body's iterations)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        return -v


def test_cancelling_run_async_stops_the_loop_iterations(executor: str) -> None:
    counter = _Counter()
    model = load_on(executor, _loop_model("Count"), custom_kernels={("app", "Count"): counter})

    async def main() -> None:
        task = asyncio.ensure_future(model.run_async(_feeds(RUNAWAY)))
        for _ in range(500):  # until the loop has surely started
            await asyncio.sleep(0.01)
            if counter.calls > 10:
                break
        assert counter.calls > 10
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    time.sleep(0.05)  # a worker may finish the iteration it was in
    stopped_at = counter.calls
    time.sleep(0.3)
    assert counter.calls == stopped_at, "the Loop kept iterating after its call was cancelled"
    np.testing.assert_array_equal(model.run(_feeds(3))["y"], -X)


@pytest.mark.anyio
async def test_cancelling_run_async_on_trio_and_uvloop_stops_the_loop(
    executor: str, anyio_backend: Any
) -> None:
    counter = _Counter()
    model = load_on(executor, _loop_model("Count"), custom_kernels={("app", "Count"): counter})
    with anyio.move_on_after(0.3):
        await model.run_async(_feeds(RUNAWAY))
    await anyio.sleep(0.05)
    stopped_at = counter.calls
    assert stopped_at > 0
    await anyio.sleep(0.3)
    assert counter.calls == stopped_at


class _Gate:
    """A custom kernel that blocks until released, counting the calls inside it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.inside = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        self.release.wait(30)
        with self._lock:
            self.inside -= 1
        return x * 2


def _gate_model() -> bytes:
    node = helper.make_node("Hold", ["x"], ["y"], domain="app")
    graph = helper.make_graph([node], "g", [_info("x", F32, [2])], [_info("y", F32, [2])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("app", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def test_max_concurrency_bounds_calls_in_flight(executor: str) -> None:
    gate = _Gate()
    host = tfrt_py.concurrency.HostContext(num_workers=6, name="limiter-test")
    model = load_on(
        executor, _gate_model(), custom_kernels={("app", "Hold"): gate}, max_concurrency=2,
        host=host,
    )  # fmt: skip

    async def main() -> list[Any]:
        tasks = [asyncio.ensure_future(model.run_async({"x": X})) for _ in range(6)]
        for _ in range(500):
            await asyncio.sleep(0.01)
            if gate.inside == 2 and model.limiter is not None and model.limiter.waiting == 4:
                break
        assert gate.inside == 2
        assert model.limiter is not None and model.limiter.waiting == 4
        tasks[-1].cancel()  # a waiter gives up its place in the queue
        gate.release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        gate.release.set()
        host.close()
    assert gate.most == 2
    assert isinstance(results[-1], asyncio.CancelledError)
    for r in results[:-1]:
        np.testing.assert_array_equal(r["y"], X * 2)
    assert model.limiter is not None and model.limiter.in_flight == 0


def _hold_the_slot(model: tfrt_py.Model, gate: _Gate) -> threading.Thread:
    """A thread whose call is inside the gate kernel (so it holds the only slot)."""
    holder = threading.Thread(target=model.run, args=({"x": X},))
    holder.start()
    for _ in range(500):
        if gate.inside == 1:
            break
        time.sleep(0.01)
    return holder


def test_max_concurrency_from_threads_and_a_deadline_while_waiting(executor: str) -> None:
    gate = _Gate()
    model = load_on(
        executor, _gate_model(), custom_kernels={("app", "Hold"): gate}, max_concurrency=1
    )
    holder = _hold_the_slot(model, gate)
    with pytest.raises(DeadlineExceeded):  # waited for the slot past its deadline
        model.run({"x": X}, timeout=0.2)
    gate.release.set()
    holder.join(30)
    np.testing.assert_array_equal(model.run({"x": X}, timeout=5)["y"], X * 2)
    assert gate.most == 1


def test_run_async_takes_a_free_slot_at_once_and_waits_within_its_deadline(
    executor: str,
) -> None:
    """A free slot is taken without waiting (``Limiter.try_acquire``); a held one is
    waited for within the call's deadline, and a later call gets the freed slot."""
    gate = _Gate()
    model = load_on(
        executor, _gate_model(), custom_kernels={("app", "Hold"): gate}, max_concurrency=1
    )
    limiter = model.limiter
    assert limiter is not None
    assert limiter.try_acquire() and not limiter.try_acquire()
    limiter.release()
    gate.release.set()
    np.testing.assert_array_equal(asyncio.run(model.run_async({"x": X}, timeout=5))["y"], X * 2)
    gate.release.clear()
    holder = _hold_the_slot(model, gate)
    with pytest.raises(DeadlineExceeded):
        asyncio.run(model.run_async({"x": X}, timeout=0.2))
    assert limiter.waiting == 0 and not limiter.try_acquire()  # the waiter left the queue
    gate.release.set()
    holder.join(30)
    np.testing.assert_array_equal(asyncio.run(model.run_async({"x": X}, timeout=5))["y"], X * 2)
    assert limiter.in_flight == 0 and gate.most == 1


_HUGE_TIMEOUT_SCRIPT = """
import sys
import numpy as np
import tfrt_py
from tests.executors.test_deadlines import RUNAWAY, X, _feeds, _loop_model
from tfrt_py.errors import DeadlineExceeded

model = tfrt_py.load(_loop_model(), executor="sync")
for t in (1e300, float("inf"), 2.0**63 / 1e6):
    np.testing.assert_array_equal(model.run(_feeds(3), timeout=t)["y"], -X)
try:
    model.run(_feeds(RUNAWAY), timeout=0.3)
except DeadlineExceeded:
    print("deadline fired")
"""


def test_a_huge_timeout_leaves_the_deadline_thread_alive() -> None:
    """N1: a timeout of 1e300 s (or inf, or a v2 request's 2**63 µs) overflowed the
    process-wide timer thread's wait and killed it; later deadlines never fired. In a
    child process: without the fix the runaway Loop runs until the child is killed."""
    out = subprocess.run([sys.executable, "-c", _HUGE_TIMEOUT_SCRIPT], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "deadline fired" in out.stdout
    assert "OverflowError" not in out.stderr


def test_a_huge_timeout_while_waiting_for_a_concurrency_slot() -> None:
    """N1: the in-flight bound's wait took the call's whole remaining time as a lock
    timeout, and 1e300 s raised OverflowError instead of waiting."""
    gate = _Gate()
    model = tfrt_py.load(_gate_model(), custom_kernels={("app", "Hold"): gate},
                         max_concurrency=1)  # fmt: skip
    holder = _hold_the_slot(model, gate)
    results: list[Any] = []
    waiter = threading.Thread(target=lambda: results.append(_run_or_error(model, 1e300)))
    waiter.start()
    for _ in range(500):
        if (model.limiter is not None and model.limiter.waiting == 1) or results:
            break
        time.sleep(0.01)
    gate.release.set()
    holder.join(30)
    waiter.join(30)
    assert len(results) == 1 and isinstance(results[0], dict), results
    np.testing.assert_array_equal(results[0]["y"], X * 2)


def _run_or_error(model: tfrt_py.Model, timeout: float) -> Any:
    try:
        return model.run({"x": X}, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - the test reports what the call raised
        return e


def test_describe_says_how_run_async_runs() -> None:
    tiny = tfrt_py.load(_gate_model(), custom_kernels={("app", "Hold"): _Gate()})
    assert "run_async: on a worker" in tiny.describe()
    assert "Hold" in tiny.describe()
    loop = tfrt_py.load(_loop_model(), executor="sync")
    assert "Loop iterations" in loop.describe()


def _relu_chain(n: int) -> Any:
    from tfrt_py.ir import GraphBuilder

    b = GraphBuilder("chain")
    y = b.input("x", np.float32, (1, 4))
    for _ in range(n):
        y = b.op("Relu", y)
    b.output(y, "y")
    return b.build()


def test_async_executor_hands_a_long_run_of_cheap_kernels_to_the_pool() -> None:
    """15000 cheap kernels would hold an event loop for tens of ms: past the inline budget
    the rest runs on the pool, and other tasks get the loop meanwhile (at the GIL's
    switch interval, 5 ms: the chain is long enough for several)."""
    model = tfrt_py.load(_relu_chain(15000), executor="async", optimize=False)
    x = np.array([[1.0, -1.0, 2.0, -2.0]], np.float32)

    async def main() -> int:
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        start = ticks
        out = await model.run_async({"x": x})
        done = True
        await t
        np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
        return ticks - start

    assert asyncio.run(main()) > 0
