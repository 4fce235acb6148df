"""A native thread pool for numba's parallel loops: idle workers sleep on a futex.

numba's TBB layer runs a ``prange`` loop's parts on TBB's workers, and TBB's idle workers
spin with ``sched_yield`` between loops. Under Linux's EEVDF scheduler each yield pushes
the yielding thread's deadline back, so next to a busy process a worker joins a loop
0.2-2.5 ms late and a model runs at one thread's speed (``benchmarks/helper_wake.py``).
This pool's workers sleep on a futex as soon as no part is left, and a thread woken from
a futex runs at once.

It replaces the one function numba's generated code calls to run a loop's parts,
``numba_parallel_for`` (and ``get_thread_id``, which parallel reductions index by), by
registering this module's functions under those names with LLVM after numba's threading
layer has started: parallel functions compiled or loaded from numba's cache later bind
to them. numba's scheduling, thread counts and chunk size (TBB's thread-local settings,
``native_threads.enter``) are unchanged; only who runs the parts is.

The pool is LLVM IR (``native_pool.ll``, commented with the protocol's invariants;
compiled once per process by ``llvm_jit``, llvmlite's MCJIT, no C compiler):
``threads - 1`` native workers, at most one per other CPU the process may use (pthreads
started through ctypes, never holding the GIL), and one task slot.

* A caller that takes the slot (a compare-and-swap of its ``pthread_self``) first closes
  the claim word (the new generation with no part left: a worker still reading the last
  task fails its claim once it sees any field of this one), then publishes the task -- the
  loop's function, arguments and part count -- under the new generation, writes
  it to the futex word of each worker the loop's thread count takes (waking those that
  sleep: a worker past that count is never woken) and claims parts itself. Parts are claimed
  with a compare-and-swap on (generation << 32 | next part), so a worker that wakes late
  never runs a part of a finished task. The caller then waits for the parts in flight,
  spinning with ``pause`` for ``_CALLER_SPIN_US``, then on a futex.
* A worker that finds no part to claim sleeps on its futex word -- after a short spin
  watching that word only when the parts it just ran were short (``_SHORT_PART_US``: a
  decode step's column blocks, where a wake-up costs as much as a part), 20-160 µs,
  adaptive (``$TFRT_PY_WORKER_SPIN_US``; the IR's I8), without ``pause`` (KVM's
  pause-loop exiting deschedules such a vCPU). Long parts spin only while the worker's
  wake-ups are slow (``_SLOW_WAKE_US`` after the publish: an idle vCPU halted, which a
  VM's host takes tens of µs to run again, once per kernel of a CNN) and it was not
  preempted lately: where a worker shares a core with a busy process, a spinning worker
  spends its share and its next part waits behind the neighbour (ResNet-18 with a busy
  neighbour: 48 ms with 100 µs of worker spin after every loop, 35 without).
* Workers are pinned, worker k to the k-th CPU of the process's affinity, when the pool
  covers them all (as onnxruntime pins its default intra-op workers; the caller is not
  pinned): unpinned, a worker woken after the caller slept (an app server between
  requests) is placed on the caller's core when the other one runs a busy process, and
  the two share it (ResNet-18, 25 ms sleeps between calls, busy neighbour: 47 ms
  unpinned, 34 pinned). The one CPU no worker holds is kept for the caller: a loop whose
  caller ran on a worker's CPU for it and the loop before moves that worker to the free
  CPU first (the IR's I9).
  Without the move, the woken worker queued behind its caller while the other CPU idled
  (a 3x3 conv at batch 1 on a 2-core Zen 5 VM: 248 against 143 µs, in 38-57% of the calls
  of a process that ran nothing else).
* A loop of one part or one thread, or started while the slot is taken (another thread's
  loop, or a loop nested in a part), runs in its caller, as numba's loop function does
  with the whole range.

Fork: a child's workers are started again and the slot emptied (``os.register_at_fork``).
Linux x86-64 only (the futex syscall number and ``pause``), and only under the numba
releases whose ``numba_parallel_for`` has the signature this IR implements
(``NUMBA_TESTED``: the releases the suite ran on); ``install`` returns False elsewhere,
``declined()`` says why, and numba's layer keeps its own. Thread-safety: ``install``
runs once, under ``native_threads``' lock; the loop functions are safe from any thread.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import time
from typing import Any

from .llvm_jit import add_symbol, compile_ir, ir_text

__all__ = [
    "ENV_NATIVE_POOL",
    "NUMBA_TESTED",
    "declined",
    "install",
    "installed",
    "pause_address",
    "placement",
    "worker_thread_ids",
    "workers",
]

#: ``TFRT_PY_NATIVE_POOL=0``: numba's loops keep TBB's own ``parallel_for``.
ENV_NATIVE_POOL = "TFRT_PY_NATIVE_POOL"

_CALLER_SPIN_US = 20.0  # the caller's spin on the parts in flight before it sleeps
#: ``TFRT_PY_WORKER_SPIN_US``: a worker's first spin for the next task after it ran short
#: parts (``_SHORT_PART_US``), before it sleeps; ``0``: it sleeps at once (read when the
#: pool starts).
ENV_WORKER_SPIN = "TFRT_PY_WORKER_SPIN_US"
#: The default. A decode step's one-row products come tens of µs apart and a futex wake
#: costs ~10 µs on a VM, as much as splitting such a product saves (1x256 @ 256x704 from
#: L3, 2-core Zen 4 VM, 2026-11-30: one thread 10.8 µs, in two parts 10.4 when the worker
#: sleeps, 5.9 when it spins). The spin adapts per worker (the IR's I8): it doubles, up to
#: 8 times this, while tasks come soon after a worker went to sleep, and falls back when
#: they come rarely.
_WORKER_SPIN_US = 20.0
_MAX_WORKER_SPIN_US = 1000.0
#: Only parts shorter than this are followed by a spin: a CNN's convolutions run parts of
#: hundreds of µs, where a wake-up is noise, and a spin next to a busy neighbour takes the
#: caller's core (ResNet-18 with a busy neighbour: 33 ms without spin, 42 with 20 µs
#: after every loop).
_SHORT_PART_US = 20.0
#: ... and after any part while the worker's wake-ups are slow: a futex wake later than
#: this after the task's publish (an idle vCPU halted: on a 2-core Firecracker VM 30-90
#: µs, paid by each of a CNN's kernels), unless the worker was preempted in its last 256
#: tasks (a busy process shares its CPU: the IR's I8). A spin after every part takes a
#: busy neighbour's CPU share from the worker: ResNet-18 1.35-1.42x -> 1.75-1.85x
#: onnxruntime's time there. 2-core Zen 5 VM, each model against onnxruntime in one
#: process, BLAS variables unset: quiet, SqueezeNet 1.70-2.09x -> 1.60-1.75x, MobileNetV2
#: 1.43-1.63x -> 1.30-1.37x (64 tasks: 1.36x and 1.16x, but 4-10% slower next to a busy
#: process); busy neighbour unchanged (1.33-1.40x, 1.60-1.62x, 1.33-1.39x).
_SLOW_WAKE_US = 10.0
_MAX_WORKERS = 63  # the IR's per-worker arrays hold 64 threads

_STATE: dict[str, Any] = {}  # engine, addresses, workers; set once by install()
_DECLINED: list[str] = []  # why the last install() returned False

#: numba releases [first, past) whose generated code calls ``numba_parallel_for(fn, args,
#: dims, steps, data, inner_ndim, array_count, num_threads)`` as ``IR_FILE`` implements it
#: (numba/np/ufunc/gufunc_scheduler.h, unchanged over these). Another release keeps
#: numba's own pool: the symbol is never replaced under an ABI nobody checked.
NUMBA_TESTED = ((0, 62), (0, 69))

#: The pool's IR: a package file, with the protocol's invariants (I1-I9) noted per
#: function and per atomic; read and compiled by ``install`` only.
IR_FILE = "native_pool.ll"


def installed() -> bool:
    """Whether numba's parallel loops run on this pool in this process."""
    return bool(_STATE)


def workers() -> int:
    """The pool's worker threads (0 when not installed)."""
    return int(_STATE.get("workers", 0))


def placement() -> tuple[int, list[int]]:
    """(the CPU no worker is pinned to, each worker's CPU); (-1, []) where they are not
    pinned. Read without the slot: a loop meanwhile may move a worker (the IR's I9)."""
    if not _STATE or _i32("free").value < 0:
        return -1, []
    cpus = (ctypes.c_int32 * 64).from_address(_STATE["glob"]["cpu"])
    return _i32("free").value, [int(cpus[k]) for k in range(1, _STATE["workers"] + 1)]


def worker_thread_ids() -> list[int]:
    """Each worker's kernel thread id (0 until it has started), for tests and tools."""
    tids: Any = (ctypes.c_int32 * 64).from_address(_STATE["glob"]["ktid"]) if _STATE else []
    return [int(tids[k]) for k in range(1, _STATE.get("workers", 0) + 1)]


def pause_address() -> int:
    """The address of ``void tfrt_py_pool_pause(int64 n)`` (``n`` x86 ``pause``
    instructions): an opaque call for spin loops in tests and benchmarks."""
    return int(_STATE["addr"]["tfrt_py_pool_pause"])


def install(threads: int) -> bool:
    """Start ``threads - 1`` workers (at most one per other CPU this process may use) and
    bind numba's ``numba_parallel_for`` and ``get_thread_id`` to this pool; call after
    numba's threading layer started (its own registration would replace ours) and before
    parallel kernels compile or load. False (nothing changed) off Linux x86-64, for fewer
    than two threads or CPUs, when ``$TFRT_PY_NATIVE_POOL`` is ``0``, or when llvmlite
    cannot build the module."""
    if _STATE:
        return True
    why = _why_not(threads)
    if why:
        _DECLINED[:] = [why]
        return False
    want = min(threads, len(os.sched_getaffinity(0)), _MAX_WORKERS + 1) - 1
    try:
        libc = ctypes.CDLL(None)
        for name in ("syscall", "pthread_self", "sched_getcpu"):
            where = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
            if not where:
                raise OSError(f"libc has no {name}")
            add_symbol(f"tfrt_py_libc_{name}", where)
        engine = compile_ir(ir_text(IR_FILE), opt=2)
    except Exception as e:  # noqa: BLE001 - no JIT here: numba's layer keeps its own pool
        _DECLINED[:] = [f"llvmlite could not build the pool ({type(e).__name__})"]
        return False
    addr = {n: engine.get_function_address(n) for n in
            ("tfrt_py_parallel_for", "tfrt_py_pool_thread_id", "tfrt_py_pool_worker",
             "tfrt_py_pool_pause", "tfrt_py_pool_cycles")}  # fmt: skip
    names = ("n", "owner", "wake", "waiting", "nworkers", "spin_c", "spin_t", "short_t",
             "wake_t", "pub_t", "free", "cpu", "ktid")  # fmt: skip
    glob = {n: engine.get_global_value_address(f"tfrt_py_pool_{n}") for n in names}
    _STATE.update(engine=engine, addr=addr, glob=glob, libc=libc, workers=0, want=want)
    _set_spins()
    _start_workers()
    add_symbol("numba_parallel_for", addr["tfrt_py_parallel_for"])
    add_symbol("get_thread_id", addr["tfrt_py_pool_thread_id"])
    os.register_at_fork(after_in_child=_after_fork_in_child)
    return True


def declined() -> str:
    """Why ``install`` last returned False ("" when it has not, or succeeded)."""
    return _DECLINED[0] if _DECLINED and not _STATE else ""


def numba_supported(version: str) -> bool:
    """Whether numba ``version`` ("0.63.1") is in ``NUMBA_TESTED``."""
    try:
        got = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:  # a development build: "0.70.0dev0" parses; anything else is unknown
        return False
    return NUMBA_TESTED[0] <= got < NUMBA_TESTED[1]


def _why_not(threads: int) -> str:
    """Why the pool cannot replace numba's here ("" when it can)."""
    if os.environ.get(ENV_NATIVE_POOL, "").strip() == "0":
        return f"${ENV_NATIVE_POOL}=0"
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return "Linux x86-64 only"
    if min(threads, len(os.sched_getaffinity(0)), _MAX_WORKERS + 1) < 2:
        return "one thread or CPU: no workers to run"
    import numba

    if not numba_supported(numba.__version__):
        first, past = (".".join(map(str, v)) for v in NUMBA_TESTED)
        return f"numba {numba.__version__} is outside the tested {first} <= numba < {past}"
    return ""


def _i64(name: str) -> Any:
    return ctypes.c_int64.from_address(_STATE["glob"][name])


def _i32(name: str) -> Any:
    return ctypes.c_int32.from_address(_STATE["glob"][name])


def _set_spins() -> None:
    """The caller's spin length in ``pause`` instructions, from the time 20k of them take here
    (~6-40 ns each, by CPU)."""
    pause = ctypes.CFUNCTYPE(None, ctypes.c_int64)(_STATE["addr"]["tfrt_py_pool_pause"])
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        pause(20_000)
        best = min(best, (time.perf_counter() - t0) / 20_000)
    per_us = 1e-6 / max(best, 1e-10)
    _i64("spin_c").value = int(_CALLER_SPIN_US * per_us)
    spin_us, cycles = worker_spin_us(), _cycles_per_us()
    _i64("spin_t").value = int(spin_us * cycles)
    _i64("short_t").value = int(_SHORT_PART_US * cycles) if spin_us else 0
    _i64("wake_t").value = int(_SLOW_WAKE_US * cycles)


def _cycles_per_us() -> float:
    """The time-stamp counter's ticks per µs, over ~1 ms of wall time."""
    cycles = ctypes.CFUNCTYPE(ctypes.c_int64)(_STATE["addr"]["tfrt_py_pool_cycles"])
    clock = time.perf_counter
    t0, c0 = clock(), cycles()
    while clock() - t0 < 1e-3:
        pass
    t1, c1 = clock(), cycles()
    return max(c1 - c0, 0) / max((t1 - t0) * 1e6, 1e-9)


def worker_spin_us() -> float:
    """The workers' spin after a part, in µs: ``$TFRT_PY_WORKER_SPIN_US`` (0 to
    ``_MAX_WORKER_SPIN_US``; anything else is the default), read when the pool starts."""
    raw = os.environ.get(ENV_WORKER_SPIN, "").strip()
    try:
        got = float(raw) if raw else _WORKER_SPIN_US
    except ValueError:
        return _WORKER_SPIN_US
    return got if 0.0 <= got <= _MAX_WORKER_SPIN_US else _WORKER_SPIN_US


def _start_workers() -> None:
    """Start the workers (detached pthreads running ``tfrt_py_pool_worker(k)``), then
    publish their count: loops use them from the next one on."""
    libc = _STATE["libc"]
    create, detach = libc.pthread_create, libc.pthread_detach
    vp = ctypes.c_void_p
    create.argtypes = [ctypes.POINTER(ctypes.c_ulong), vp, vp, vp]
    detach.argtypes = [ctypes.c_ulong]
    cpus = sorted(os.sched_getaffinity(0))
    pin = len(cpus) == _STATE["want"] + 1 and cpus[-1] < 1024
    pinned = (ctypes.c_int32 * 64).from_address(_STATE["glob"]["cpu"])
    started = 0
    for k in range(1, _STATE["want"] + 1):
        tid = ctypes.c_ulong()
        if create(ctypes.byref(tid), None, _STATE["addr"]["tfrt_py_pool_worker"], k) != 0:
            break
        if pin:
            pin = _pin(libc, tid.value, cpus[k % len(cpus)])
            pinned[k] = cpus[k % len(cpus)]
        detach(tid.value)
        started = k
    _STATE["workers"] = started
    # I9: the caller's CPU, kept free of workers, where every worker started pinned
    _i32("free").value = cpus[0] if pin and started == _STATE["want"] else -1
    _i64("nworkers").value = started


def _pin(libc: Any, thread: int, cpu: int) -> bool:
    """Worker ``thread`` runs on ``cpu`` (< 1024) only; False where that failed."""
    mask = (ctypes.c_uint64 * 16)()  # a cpu_set_t: 1024 CPUs
    mask[cpu // 64] = 1 << (cpu % 64)
    return libc.pthread_setaffinity_np(ctypes.c_ulong(thread), ctypes.c_size_t(128), mask) == 0


def _after_fork_in_child() -> None:
    """The child has only the forking thread: no task (no part to claim), a free slot,
    no sleeping workers; then workers of its own."""
    _i64("nworkers").value = 0
    _i64("n").value = 0
    _i64("owner").value = 0
    _i32("free").value = -1
    ctypes.memset(_STATE["glob"]["ktid"], 0, 64 * 4)
    ctypes.memset(_STATE["glob"]["wake"], 0, 64 * 64)
    _i32("waiting").value = 0
    _start_workers()
