"""Does ``await model.run_async`` keep the event loop free? A 1 ms ticker's lag, and calls/s.

    python benchmarks/loop_lag.py [--seconds S] [--loops asyncio,uvloop,trio]

For a tiny model (an MLP, tens of µs) and a 10-50 ms model (six 1024x1024 layers at
batch 16), on every executor the model accepts (sync, async, native where it lowers) and
on asyncio, uvloop and trio: one task awaits ``run_async`` in a loop (then 32 tasks at
once) while a ticker task sleeps 1 ms and records how late it wakes. Prints the ticker's
p50/p99 lag and calls/s; onnxruntime in a worker thread (``anyio.to_thread``) is the
reference. Also the tiny model's latency through ``run_async`` against ``run`` (target:
within 1.2x). Everything in one process; runtimes interleaved by round.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import tfrt_py

F32 = np.float32


def _mlp(name: str, batch: int, widths: list[int], seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(F32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]  # fmt: skip
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, widths[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, widths[-1]])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()


MODELS = {
    "tiny (MLP 64-256-256-10, batch 1)": (_mlp("tiny", 1, [64, 256, 256, 10], 0), (1, 64)),
    "heavy (6 x 1024x1024, batch 16)": (_mlp("heavy", 16, [1024] * 7, 1), (16, 1024)),
}

Call = Callable[[], Awaitable[Any]]


async def _measure(call: Call, seconds: float, tasks: int) -> tuple[float, float, float]:
    """(ticker lag p50 ms, p99 ms, calls/s) while ``tasks`` tasks await ``call``."""
    lags: list[float] = []
    calls = 0
    stop = time.perf_counter() + seconds

    async def ticker() -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await anyio.sleep(0.001)
            lags.append((time.perf_counter() - t0 - 0.001) * 1e3)

    async def caller() -> None:
        nonlocal calls
        while time.perf_counter() < stop:
            await call()
            calls += 1

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        for _ in range(tasks):
            tg.start_soon(caller)
    elapsed = time.perf_counter() - t0
    lags.sort()
    p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else float("nan")
    return statistics.median(lags) if lags else float("nan"), p99, calls / elapsed


def _runners(data: bytes, shape: tuple[int, ...]) -> dict[str, Call]:
    x = np.random.default_rng(2).standard_normal(shape).astype(F32)
    out: dict[str, Call] = {}
    for executor in ("sync", "async", "native"):
        try:
            model = tfrt_py.load(data, executor=executor, native="eager")
        except tfrt_py.errors.TfrtError as e:
            print(f"  ({executor}: {type(e).__name__}: {str(e)[:80]})")
            continue
        model.run({"x": x})
        out[f"tfrt_py {executor}"] = lambda m=model: m.run_async({"x": x})
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])

    async def ort_thread() -> Any:
        return await anyio.to_thread.run_sync(sess.run, None, {"x": x})

    out["onnxruntime to_thread"] = ort_thread
    return out


def _backend(name: str) -> tuple[str, dict[str, Any]]:
    if name == "uvloop":
        return "asyncio", {"use_uvloop": True}
    return name, {}


def run_vs_run_async(data: bytes, shape: tuple[int, ...], n: int = 3000) -> None:
    """The tiny model: µs per call through run() and through await run_async()."""
    x = np.random.default_rng(3).standard_normal(shape).astype(F32)
    model = tfrt_py.load(data, executor="sync")
    model.run({"x": x})

    async def through_async() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await model.run_async({"x": x})
        return (time.perf_counter() - t0) / n * 1e6

    sync_us, async_us = [], []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            model.run({"x": x})
        sync_us.append((time.perf_counter() - t0) / n * 1e6)
        async_us.append(anyio.run(through_async))
    s, a = statistics.median(sync_us), statistics.median(async_us)
    print(f"tiny model, sync executor: run {s:.1f} µs, run_async {a:.1f} µs, ratio {a / s:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--loops", default="asyncio,uvloop,trio")
    ap.add_argument("--tasks", default="1,32")
    a = ap.parse_args()
    print(f"tfrt_py {tfrt_py.__version__}; ticker: 1 ms sleeps; lag = how late it woke")
    tiny = MODELS["tiny (MLP 64-256-256-10, batch 1)"]
    run_vs_run_async(*tiny)
    for title, (data, shape) in MODELS.items():
        print(f"\n## {title}\n")
        runners = _runners(data, shape)
        print("| loop | tasks | runtime | lag p50 ms | lag p99 ms | calls/s |")
        print("|---|---|---|---|---|---|")
        for loop in a.loops.split(","):
            backend, opts = _backend(loop)
            for tasks in (int(t) for t in a.tasks.split(",")):
                for name, call in runners.items():
                    p50, p99, rate = anyio.run(
                        _measure, call, a.seconds, tasks, backend=backend, backend_options=opts
                    )
                    print(f"| {loop} | {tasks} | {name} | {p50:.2f} | {p99:.2f} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
