"""Throughput under concurrency: C coroutines share N calls to one model.

    python benchmarks/throughput.py [--model M2] [--concurrency 1,8,64] [--calls 4000]

Runtimes: ``await model.run_async`` (tfrt_py), and onnxruntime driven the way asyncio
users do it today: ``loop.run_in_executor`` (default thread pool) and blocking inline in
the coroutine. Each on asyncio and on uvloop. Prints requests/s and p50/p99 latency.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import onnxruntime as ort
from anchor_models import ANCHORS

import tfrt_py

Call = Callable[[], Awaitable[object]]


async def drive(call: Call, concurrency: int, calls: int) -> tuple[float, list[float]]:
    """Run ``calls`` awaits of ``call`` from ``concurrency`` coroutines; (seconds, latencies)."""
    latencies: list[float] = []
    per = calls // concurrency

    async def worker() -> None:
        for _ in range(per):
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0, latencies


def runners(key: str) -> dict[str, Callable[[], Call]]:
    anchor = ANCHORS[key]()
    data = anchor.model.SerializeToString()
    model = tfrt_py.load(data)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = anchor.feeds

    def tfrt_async() -> Call:
        return lambda: model.run_async(feeds)

    def ort_executor() -> Call:
        loop = asyncio.get_running_loop()
        return lambda: loop.run_in_executor(None, sess.run, None, feeds)

    def ort_inline() -> Call:
        async def call() -> object:
            return sess.run(None, feeds)

        return call

    return {
        f"tfrt_py run_async [{model.executor}]": tfrt_async,
        "onnxruntime run_in_executor": ort_executor,
        "onnxruntime inline": ort_inline,
    }


async def one(make: Callable[[], Call], concurrency: int, calls: int) -> tuple[float, float, float]:
    call = make()
    await drive(call, concurrency, min(calls, 200))  # warm-up
    seconds, lat = await drive(call, concurrency, calls)
    lat_us = sorted(x * 1e6 for x in lat)
    p99 = lat_us[min(len(lat_us) - 1, int(0.99 * len(lat_us)))]
    return len(lat) / seconds, statistics.median(lat_us), p99


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="M2")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--calls", type=int, default=4000)
    a = ap.parse_args()
    loops: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop

        loops["uvloop"] = uvloop.new_event_loop
    except ImportError:
        print("uvloop not installed: asyncio only")
    print(f"model {a.model}, {a.calls} calls per row\n")
    print("| loop | runtime | concurrency | requests/s | p50 µs | p99 µs |")
    print("|---|---|---|---|---|---|")
    for loop_name, new_loop in loops.items():
        for conc in (int(c) for c in a.concurrency.split(",")):
            for name, make in runners(a.model).items():
                loop = new_loop()
                try:
                    rps, p50, p99 = loop.run_until_complete(one(make, conc, a.calls))
                finally:
                    loop.close()
                print(f"| {loop_name} | {name} | {conc} | {rps:,.0f} | {p50:.0f} | {p99:.0f} |")


if __name__ == "__main__":
    main()
