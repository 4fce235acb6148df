"""Soak: 100k in-process calls on the bundled mlp_small per executor; calls/s and RSS.

    python benchmarks/soak.py [--calls N] [--warmup N]

For the sync executor (``model.run``) and the async executor (``await model.run_async``
on asyncio), prints RSS (``/proc/self/statm``) after warm-up and at checkpoints, calls/s
per segment, and the growth from the end of warm-up to the last call. Flat RSS is the
claim; ``tests/test_soak.py`` asserts it (2 MiB bound).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

import tfrt_py

MLP = Path(tfrt_py.__file__).parent / "examples" / "mlp_small.onnx"
MiB = 1 << 20


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


async def _soak(
    label: str, call: Callable[[], Awaitable[object]], calls: int, warmup: int, parts: int
) -> None:
    for _ in range(warmup):
        await call()
    gc.collect()
    base = rss_mib()
    print(f"{label}: RSS after {warmup:,} warm-up calls {base:8.2f} MiB")
    step = calls // parts
    done = 0
    t_all = time.perf_counter()
    while done < calls:
        n = min(step, calls - done)
        t0 = time.perf_counter()
        for _ in range(n):
            await call()
        dt = time.perf_counter() - t0
        done += n
        print(f"{label}: {done:>8,} calls  {n / dt:>9,.0f} calls/s  RSS {rss_mib():8.2f} MiB")
    total = time.perf_counter() - t_all
    gc.collect()
    end = rss_mib()
    print(
        f"{label}: {calls:,} calls in {total:.1f} s ({calls / total:,.0f} calls/s), "
        f"RSS growth after warm-up {end - base:+.2f} MiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--warmup", type=int, default=5_000)
    ap.add_argument("--checkpoints", type=int, default=5)
    args = ap.parse_args()
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)}
    print(f"model {MLP.name}, feeds x{list(feeds['x'].shape)}, RSS at start {rss_mib():.2f} MiB")

    sync = tfrt_py.load(MLP, executor="sync")

    async def run_sync() -> object:
        return sync.run(feeds)

    asyncio.run(_soak("sync  run      ", run_sync, args.calls, args.warmup, args.checkpoints))

    df = tfrt_py.load(MLP, executor="async")

    async def run_async() -> object:
        return await df.run_async(feeds)

    asyncio.run(_soak("async run_async", run_async, args.calls, args.warmup, args.checkpoints))


if __name__ == "__main__":
    main()
