"""numba's parallel loops on tfrt_py's native pool (``concurrency.native_pool``): a loop's
parts run on two threads at once, reductions get a slot per thread, concurrent and nested
loops compute what serial ones do, and a forked child starts workers of its own."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from tfrt_py.concurrency import native_pool, native_threads

numba = pytest.importorskip("numba", reason="the pool runs numba's parallel loops")
pytestmark = pytest.mark.skipif(
    not (native_threads.ready() and native_threads.max_threads() > 1 and native_pool.installed()),
    reason="the native pool needs numba's TBB layer started (see test_native_threads), Linux "
    "x86-64 and two CPUs",
)

_RENDEZVOUS = """
import ctypes
import numba
import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic
from numba.np.ufunc.parallel import _iget_thread_id
from tfrt_py.concurrency import native_pool

_pause = ctypes.CFUNCTYPE(None, ctypes.c_int64)(native_pool.pause_address())


@intrinsic
def _read(typingctx, arr, i):
    # arr[i] as an atomic load: the compiler reads it on every spin
    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.load_atomic(builder.gep(ary.data, [args[1]]), "monotonic", 8)

    return types.int64(arr, types.intp), codegen


@njit(parallel=True, nogil=True)
def rendezvous(flags, ids, spins):
    # part i marks itself, then waits (at most ``spins`` pauses) for the other part
    for i in prange(2):
        ids[i] = _iget_thread_id()
        flags[i] = 1
        for _ in range(spins):
            if _read(flags, 1 - i) == 1:
                break
            _pause(1)
        flags[2 + i] = flags[1 - i]


def met():
    numba.set_num_threads(2)
    numba.set_parallel_chunksize(1)
    flags = np.zeros(4, np.int64)
    ids = np.full(2, -1, np.int64)
    rendezvous(flags, ids, 200_000_000)
    return bool(flags[2] == 1 and flags[3] == 1), sorted(ids.tolist())
"""


@functools.cache
def _namespace() -> dict[str, object]:
    """The rendezvous loop, compiled on first use (never where the module is skipped)."""
    ns: dict[str, object] = {}
    exec(compile(_RENDEZVOUS, "rendezvous", "exec"), ns)
    return ns


@numba.njit(parallel=True, nogil=True)
def _row_sums(x):
    out = np.empty(x.shape[0])
    for i in numba.prange(x.shape[0]):
        out[i] = x[i].sum()
    return out


@numba.njit(parallel=True, nogil=True)
def _nested(x):
    out = np.empty(x.shape[0])
    for b in numba.prange(x.shape[0]):
        out[b] = _row_sums(x[b]).sum()  # a parallel loop inside a part: runs in its thread
    return out


@numba.njit(parallel=True, nogil=True)
def _total(x):
    s = 0.0
    for i in numba.prange(x.shape[0]):
        s += x[i]
    return s


def test_the_pool_is_installed_with_a_worker_per_other_cpu() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert native_pool.workers() == min(native_threads.max_threads(), cpus) - 1


def test_two_parts_of_a_loop_run_at_once_on_threads_with_their_own_ids() -> None:
    met, ids = _namespace()["met"]()  # type: ignore[operator]
    assert met, "the loop's two parts never ran at the same time"
    assert ids == [0, 1]


def test_a_loop_stamps_its_publish_time_for_the_workers_wake_up_clock() -> None:
    """I8: a worker spins after long parts only while its wake-ups come late after the
    publish; the publish time is written by each loop that goes to the workers, and the
    threshold is set when the pool starts."""
    if native_pool.workers() == 0:
        pytest.skip("one CPU: loops run in their caller, nothing is published")
    native_threads.enter(2)
    x = np.random.default_rng(0).random((64, 1000))
    stamp = native_pool._i64("pub_t")
    assert native_pool._i64("wake_t").value > 0
    _row_sums(x)
    first = stamp.value
    _row_sums(x)
    assert first > 0 and stamp.value > first


def _loops_on(cpu: int, loops: int) -> list[tuple[int, list[int]]]:
    """``loops`` parallel loops from a thread pinned to ``cpu``; the placement after each."""
    seen: list[tuple[int, list[int]]] = []

    def caller() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        native_threads.enter(2)
        for _ in range(loops):
            _row_sums(np.random.default_rng(0).random((64, 1000)))
            seen.append(native_pool.placement())

    t = threading.Thread(target=caller)
    t.start()
    t.join()
    return seen


def test_a_worker_pinned_to_the_callers_cpu_moves_to_the_free_one() -> None:
    """I9: a caller that runs on a pinned worker's CPU for two loops in a row has that
    worker moved to the CPU no worker holds (else the worker queues behind its caller
    while that CPU idles); one loop there between loops elsewhere moves nothing (two
    callers on two CPUs taking turns would move a worker every loop)."""
    free, cpus = native_pool.placement()
    if free < 0 or not cpus:
        pytest.skip("the workers are not pinned here (the pool does not cover every CPU)")
    taken = cpus[0]  # worker 1's CPU
    _loops_on(free, 1)  # a loop from the free CPU: no run of loops on a worker's CPU
    assert _loops_on(taken, 1) == [(free, cpus)]
    _loops_on(free, 1)
    assert _loops_on(taken, 2) == [(free, cpus), (taken, [free, *cpus[1:]])]
    assert os.sched_getaffinity(native_pool.worker_thread_ids()[0]) == {free}


def test_a_parallel_reduction_sums_what_numpy_sums() -> None:
    native_threads.enter(2)
    x = np.random.default_rng(0).random(1_000_003)
    for _ in range(20):
        assert _total(x) == pytest.approx(x.sum(), rel=1e-12)


def test_concurrent_and_nested_loops_compute_what_serial_ones_do() -> None:
    x = np.random.default_rng(1).random((6, 40, 300))
    want = x.sum(axis=(1, 2))
    errors: list[str] = []

    def caller() -> None:
        native_threads.enter(2)
        for _ in range(30):
            got = _nested(x)
            if not np.allclose(got, want, rtol=1e-12):
                errors.append(f"{got} != {want}")

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_forked_child_starts_workers_of_its_own() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from tfrt_py.concurrency import native_threads
        assert native_threads.ready()
        exec(compile(sys.argv[1], "rendezvous", "exec"))
        assert met()[0], "parent"
        pid = os.fork()
        if pid == 0:
            os._exit(0 if met()[0] else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, _RENDEZVOUS], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]


_FALLBACK = textwrap.dedent(
    """
    import sys
    import numba, numpy as np
    if sys.argv[1] == "old-numba":
        numba.__version__ = "0.99.0"  # a release the pool's IR was never checked against
    from tfrt_py.concurrency import native_pool, native_threads

    @numba.njit(parallel=True, nogil=True)
    def row_sums(x):
        out = np.empty(x.shape[0])
        for i in numba.prange(x.shape[0]):
            out[i] = x[i].sum()
        return out

    assert native_threads.ready(), "TBB's layer itself runs"
    assert not native_pool.installed(), "the pool must not replace numba's parallel_for"
    print(native_pool.declined())
    numba.set_num_threads(2)
    x = np.random.default_rng(0).random((64, 500))
    assert np.allclose(row_sums(x), x.sum(axis=1)), "TBB's own workers run the loop"
    """
)


@pytest.mark.parametrize(
    ("case", "env", "why"),
    [
        ("switched-off", {native_pool.ENV_NATIVE_POOL: "0"}, "TFRT_PY_NATIVE_POOL=0"),
        ("old-numba", {}, "numba 0.99.0 is outside the tested"),
    ],
)
def test_where_the_pool_is_not_installed_numba_keeps_its_own(
    case: str, env: dict[str, str], why: str
) -> None:
    """The off-switch and the numba version check: the symbol is never replaced, the reason
    is reported (``features()`` shows it), and parallel loops run on TBB's workers."""
    done = subprocess.run(
        [sys.executable, "-c", _FALLBACK, case],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert why in done.stdout


def test_numba_releases_outside_the_tested_range_are_refused() -> None:
    first, past = native_pool.NUMBA_TESTED
    assert native_pool.numba_supported(numba.__version__)
    assert native_pool.numba_supported(f"{first[0]}.{first[1]}.0")
    assert not native_pool.numba_supported(f"{first[0]}.{first[1] - 1}.9")
    assert not native_pool.numba_supported(f"{past[0]}.{past[1]}.0")
    assert not native_pool.numba_supported("unknown")


@numba.njit(parallel=True, nogil=True)
def _scaled_rows(x, s):
    out = np.empty(x.shape[0])
    for i in numba.prange(x.shape[0]):
        out[i] = x[i].sum() * s
    return out


def test_the_pool_protocol_under_stress() -> None:
    """Six threads start loops at once, thousands of times, with part counts from 1 to
    more than the workers and thread counts that change between loops: every loop's every
    part runs exactly once (the sums say so), nested loops included, and no call hangs
    (the test's own timeout would fail it)."""
    rng = np.random.default_rng(7)
    shapes = [(int(rng.integers(1, 40)), int(rng.integers(1, 300))) for _ in range(64)]
    arrays = [rng.random(s) for s in shapes]
    nested = rng.random((5, 9, 50))
    errors: list[str] = []

    def caller(seed: int) -> None:
        local = np.random.default_rng(seed)
        for n in range(400):
            native_threads.enter(int(local.integers(1, 3)))
            x = arrays[int(local.integers(len(arrays)))]
            got = _scaled_rows(x, 2.0)
            if not np.allclose(got, x.sum(axis=1) * 2.0, rtol=1e-12):
                errors.append(f"thread {seed} loop {n}: rows {x.shape}")
            if n % 50 == 0 and not np.allclose(_nested(nested), nested.sum(axis=(1, 2))):
                errors.append(f"thread {seed} loop {n}: nested")

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a loop never finished"
    assert errors == []


_ALTERNATING = textwrap.dedent(
    """
    import sys, time
    import numba, numpy as np
    from tfrt_py.concurrency import native_pool, native_threads

    @numba.njit(parallel=True, nogil=True)
    def bump(y, parts):
        for b in numba.prange(parts):
            y[b] += 1

    assert native_threads.ready() and native_pool.installed()
    y = np.zeros(16, np.int64)
    calls = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < float(sys.argv[1]):
        native_threads.enter(2)
        for k in range(1000):
            bump(y, 2 + 7 * (k & 1))  # 2 parts, then 9: the next loop has more parts
        calls += 1000
    assert y.sum() == calls // 2 * (2 + 9), (int(y.sum()), calls)
    print("ok", calls)
    """
)


@pytest.mark.parametrize("spin", ["", "0", "1000"])
@pytest.mark.compiles
def test_back_to_back_loops_of_growing_part_counts_finish(spin: str) -> None:
    """One caller alternating loops of 2 and 9 parts. Before the pool closed a task's word
    before writing the next task's fields (I7 in native_pool.ll), a worker that read the
    old word and then the new part count claimed a part the old task never had; the next
    loop's caller then waited forever (within a second here). Every part runs once: the
    sum says so; a hang fails the subprocess's timeout. With the workers' spin after short
    parts (I8) at its default, off, and long enough that they never sleep between loops."""
    env = {**os.environ, native_pool.ENV_WORKER_SPIN: spin}
    done = subprocess.run(
        [sys.executable, "-c", _ALTERNATING, "3"], capture_output=True, text=True, timeout=120,
        env=env,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]


@pytest.mark.parametrize(
    ("raw", "want"),
    [("", None), ("0", 0.0), ("150", 150.0), ("-1", None), ("1e9", None), ("fast", None)],
)
def test_the_workers_spin_comes_from_the_environment(
    raw: str, want: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$TFRT_PY_WORKER_SPIN_US``: 0 to 1000 µs; anything else is the default."""
    monkeypatch.setenv(native_pool.ENV_WORKER_SPIN, raw)
    assert native_pool.worker_spin_us() == (native_pool._WORKER_SPIN_US if want is None else want)
