"""Soak: many in-process calls on one model keep the resident set flat after warm-up.

100k ``run`` calls of the bundled mlp_small on the sync executor, 20k ``run_async`` calls
on the async executor under asyncio. RSS (``/proc/self/statm``) is read after a warm-up of
a few thousand calls -- plans made, arenas pooled, caches and the allocator settled -- and
again at the end; the growth must stay under 2 MiB (a leak of even 32 bytes per call would
show as ~3 MiB over 100k calls). A memory assertion, not a timing one. Marked slow (about
a minute on the 2-core CI machines); still run in CI. ``benchmarks/soak.py`` prints the
same runs with calls/s and RSS at checkpoints.
"""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

import numpy as np
import pytest

import tfrt_py

MLP = Path(tfrt_py.__file__).parent / "examples" / "mlp_small.onnx"
MiB = 1 << 20
#: Allowed RSS growth between the end of warm-up and the last call.
BOUND = 2 * MiB

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)"),
]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)}


def test_sync_run_100k_calls_rss_flat() -> None:
    model = tfrt_py.load(MLP, executor="sync")
    feeds = _feeds()
    expected = model.run(feeds)
    for _ in range(5_000):  # warm-up
        model.run(feeds)
    gc.collect()
    before = rss_bytes()
    out = expected
    for _ in range(100_000):
        out = model.run(feeds)
    gc.collect()
    grown = rss_bytes() - before
    for name, v in expected.items():
        np.testing.assert_array_equal(out[name], v)  # still answering right
    assert grown < BOUND, f"RSS grew {grown / MiB:.2f} MiB over 100k calls after warm-up"


def test_async_run_async_20k_calls_rss_flat() -> None:
    model = tfrt_py.load(MLP, executor="async")
    feeds = _feeds()
    expected = tfrt_py.load(MLP, executor="sync").run(feeds)

    async def calls(n: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for _ in range(n):
            out = await model.run_async(feeds)
        return out

    async def main() -> tuple[int, dict[str, np.ndarray]]:
        await calls(3_000)  # warm-up, on the loop that does the counted calls
        gc.collect()
        before = rss_bytes()
        out = await calls(20_000)
        gc.collect()
        return rss_bytes() - before, out

    grown, out = asyncio.run(main())
    for name, v in expected.items():
        np.testing.assert_allclose(out[name], v, rtol=1e-6, atol=1e-7)
    assert grown < BOUND, f"RSS grew {grown / MiB:.2f} MiB over 20k run_async calls after warm-up"
