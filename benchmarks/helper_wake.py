"""How soon a native helper thread joins a parallel loop, quiet and next to a busy process.

    python benchmarks/helper_wake.py [--busy] [--pin] [--parts 2] [--runs 60]

tfrt_py's compiled kernels split their work in numba ``prange`` loops whose parts run on
tfrt_py's native pool (``concurrency/native_pool.py``; ``TFRT_PY_NATIVE_POOL=0``: on TBB's
own workers): the caller takes a part and a worker the others. This probe runs such a
loop of ``--parts`` equal parts (each a fixed amount of scalar arithmetic: 100 µs to 3
ms), with the caller computing alone for a *gap* between loops (200 µs, as between a
model's kernels; 5 and 20 ms, long enough for a worker to go to sleep), and prints per
block size and gap:

* the wall time of one loop against the parts run back to back (``serial``);
* the share of parts a helper took;
* the median time from the loop's start to the helper's first part.

``--busy`` starts a ``while True: pass`` process pinned to the last core (killed at exit);
``--pin`` pins the helpers to every core but the caller's. Nothing is asserted: the
figures are for reading. Measured on the 2-core machine (kernel 6.18, oneTBB 2022) with
the neighbour, 30 loops a row: on TBB's workers, after 200 µs gaps a helper starts
0.02-2.5 ms late and takes 2-27% of the parts, so a loop takes as long as its parts in a
row (2.01 ms for 2 x 1 ms); TBB's idle workers spin with ``sched_yield`` before they
sleep, and under EEVDF each yield pushes the yielding thread's deadline back. On the
native pool, whose workers sleep on a futex at once, a helper starts within ~3 µs after
every gap and takes 37-50% (1.02 ms for 2 x 1 ms).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np


class _Timespec(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]


def build() -> dict[str, Any]:
    """The compiled loop, its scalar work and the helper pinning, as numba functions."""
    from numba import njit, prange

    libc = ctypes.CDLL(None)
    gettid = libc.syscall
    gettid.argtypes = [ctypes.c_long]
    gettid.restype = ctypes.c_long
    clock = libc.clock_gettime
    clock.argtypes = [ctypes.c_int, ctypes.c_void_p]
    clock.restype = ctypes.c_int
    setaff = libc.sched_setaffinity
    setaff.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
    setaff.restype = ctypes.c_int
    sys_gettid = 186  # x86-64

    @njit(nogil=True)
    def now(buf: Any) -> int:
        clock(1, buf.ctypes.data)  # CLOCK_MONOTONIC
        return buf[0] * 1_000_000_000 + buf[1]

    @njit(nogil=True)
    def work(n: int) -> float:
        s = 0.0
        for k in range(n):  # a dependent chain: neither vectorized nor folded away
            s = s * 0.9999999 + k * 1e-9
        return s

    @njit(parallel=True, nogil=True)
    def loop(n: int, parts: int, starts: Any, tids: Any, bufs: Any) -> None:
        for p in prange(parts):
            starts[p] = now(bufs[p])
            tids[p] = gettid(sys_gettid)
            bufs[p, 0] += int(work(n) > 1e300)

    @njit(parallel=True, nogil=True)
    def pin(caller: int, mask: Any, n: int, bufs: Any) -> None:
        for i in prange(64):  # enough iterations for every worker to take one
            if gettid(sys_gettid) != caller:
                setaff(0, mask.shape[0], mask.ctypes.data)
            bufs[i, 0] += int(work(n) > 1e300)

    return {"work": work, "loop": loop, "pin": pin, "tid": lambda: gettid(sys_gettid)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", action="store_true", help="a busy-loop neighbour on the last core")
    ap.add_argument("--pin", action="store_true", help="helpers off the caller's core")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--runs", type=int, default=60, help="loops per figure")
    a = ap.parse_args()
    from tfrt_py.concurrency import native_threads

    if not native_threads.ready():
        sys.exit("helper_wake: numba's TBB threading layer is not available here")
    from tfrt_py.concurrency import native_pool

    print(f"parts run on {'the native pool' if native_pool.installed() else 'TBB workers'}")
    native_threads.enter(2)
    f = build()
    parts = a.parts
    bufs = np.zeros((max(64, parts), 2), np.int64)
    starts = np.zeros(parts, np.int64)
    tids = np.zeros(parts, np.int64)
    f["loop"](10, parts, starts, tids, bufs)
    f["work"](10)
    t0 = time.perf_counter()
    f["work"](10_000_000)
    per = (time.perf_counter() - t0) / 1e7  # seconds per iteration of work()
    caller = f["tid"]()
    cpus = sorted(os.sched_getaffinity(0))
    busy = None
    if a.busy:
        last = cpus[-1]
        busy = subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            preexec_fn=lambda: os.sched_setaffinity(0, {last}),
        )
        time.sleep(0.5)
    try:
        if a.pin:
            os.sched_setaffinity(0, {cpus[0]})
            mask = np.zeros(cpus[-1] // 8 + 1, np.uint8)  # a cpu_set_t's bytes
            for c in cpus[1:]:
                mask[c // 8] |= 1 << (c % 8)
            f["pin"](caller, mask, int(200e-6 / per), bufs)
        where = "busy neighbour" if a.busy else "quiet"
        helpers = "pinned" if a.pin else "free"
        print(f"{where}, helpers {helpers}, {parts} parts, {a.runs} loops per row")
        print("| gap | part | wall | serial | helper parts | helper start (median) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for gap_us in (200, 5000, 20000):
            for part_us in (100, 300, 1000, 3000):
                n = int(part_us * 1e-6 / per)
                walls, shares, lags = [], [], []
                for _ in range(a.runs):
                    f["work"](int(gap_us * 1e-6 / per))
                    t0 = time.perf_counter()
                    f["loop"](n, parts, starts, tids, bufs)
                    walls.append(time.perf_counter() - t0)
                    helped = [i for i in range(parts) if tids[i] != caller]
                    shares.append(len(helped) / parts)
                    if helped:
                        lags.append((min(starts[i] for i in helped) - starts.min()) / 1e3)
                lag = f"{statistics.median(lags):,.0f} µs" if lags else "never"
                print(f"| {gap_us:,} µs | {part_us:,} µs | {statistics.median(walls) * 1e3:.2f} ms "
                      f"| {parts * part_us / 1e3:.2f} ms | {statistics.mean(shares):.0%} | {lag} |",
                      flush=True)  # fmt: skip
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    main()
