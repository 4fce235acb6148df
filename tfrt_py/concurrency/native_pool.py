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

The pool is LLVM IR (built here, compiled once per process by llvmlite's MCJIT, no C
compiler): ``threads - 1`` native workers, at most one per other CPU the process may use
(pthreads started through ctypes, never holding the GIL), and one task slot.

* A caller that takes the slot (a compare-and-swap of its ``pthread_self``) publishes the
  task -- the loop's function, arguments and part count -- under a new generation, writes
  it to the futex word of each worker the loop's thread count takes (waking those that
  sleep: a worker past that count is never woken) and claims parts itself. Parts are claimed
  with a compare-and-swap on (generation << 32 | next part), so a worker that wakes late
  never runs a part of a finished task. The caller then waits for the parts in flight,
  spinning with ``pause`` for ``_CALLER_SPIN_US``, then on a futex.
* A worker sleeps on its futex word as soon as it finds no part to claim. It does not
  spin: where a worker and the caller share a core (the scheduler puts them
  together next to a busy process), a spinning worker takes the caller's time (ResNet-18
  with a busy neighbour: 48 ms with 100 µs of worker spin, 35 without).
* Workers are pinned, worker k to the k-th CPU of the process's affinity, when the pool
  covers them all (as onnxruntime pins its default intra-op workers; the caller is not
  pinned): unpinned, a worker woken after the caller slept (an app server between
  requests) is placed on the caller's core when the other one runs a busy process, and
  the two share it (ResNet-18, 25 ms sleeps between calls, busy neighbour: 47 ms
  unpinned, 34 pinned).
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

__all__ = [
    "ENV_NATIVE_POOL",
    "NUMBA_TESTED",
    "declined",
    "install",
    "installed",
    "pause_address",
    "workers",
]

#: ``TFRT_PY_NATIVE_POOL=0``: numba's loops keep TBB's own ``parallel_for``.
ENV_NATIVE_POOL = "TFRT_PY_NATIVE_POOL"

_CALLER_SPIN_US = 20.0  # the caller's spin on the parts in flight before it sleeps
_MAX_WORKERS = 63  # the IR's per-worker arrays hold 64 threads

_STATE: dict[str, Any] = {}  # engine, addresses, workers; set once by install()
_DECLINED: list[str] = []  # why the last install() returned False

#: numba releases [first, past) whose generated code calls ``numba_parallel_for(fn, args,
#: dims, steps, data, inner_ndim, array_count, num_threads)`` as ``_IR`` implements it
#: (numba/np/ufunc/gufunc_scheduler.h, unchanged over these). Another release keeps
#: numba's own pool: the symbol is never replaced under an ABI nobody checked.
NUMBA_TESTED = ((0, 62), (0, 69))

_IR = r"""
@tfrt_py_pool_gen = global i32 0, align 64
@tfrt_py_pool_next = global i64 0, align 64
@tfrt_py_pool_pending = global i32 0, align 64
@tfrt_py_pool_waiting = global i32 0, align 64
@tfrt_py_pool_owner = global i64 0, align 64
@tfrt_py_pool_fn = global ptr null, align 64
@tfrt_py_pool_args = global ptr null, align 8
@tfrt_py_pool_dims = global ptr null, align 8
@tfrt_py_pool_steps = global ptr null, align 8
@tfrt_py_pool_data = global ptr null, align 8
@tfrt_py_pool_argl = global i64 0, align 8
@tfrt_py_pool_arrc = global i64 0, align 8
@tfrt_py_pool_n = global i64 0, align 8
@tfrt_py_pool_nth = global i64 0, align 8
@tfrt_py_pool_nworkers = global i64 0, align 64
@tfrt_py_pool_spin_c = global i64 0, align 8
@tfrt_py_pool_wtid = global [64 x i64] zeroinitializer, align 64
; per worker, a cache line: [0] the futex word a task's generation is written to, [1] 1
; while the worker sleeps on it
@tfrt_py_pool_wake = global [64 x [16 x i32]] zeroinitializer, align 64

declare i64 @tfrt_py_libc_syscall(i64, ...)
declare i64 @tfrt_py_libc_pthread_self()
declare void @llvm.x86.sse2.pause()
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)

define void @tfrt_py_pool_pause(i64 %n) {
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%i1, %body]
  %more = icmp ult i64 %i, %n
  br i1 %more, label %body, label %done
body:
  call void @llvm.x86.sse2.pause()
  %i1 = add i64 %i, 1
  br label %head
done:
  ret void
}

; part %i of the task: the loop function over one schedule row, its array arguments
; advanced by %i steps (as numba's TBB parallel_for does per range)
define private void @run_part(ptr %fn, ptr %args, ptr %dims, ptr %steps, ptr %data,
                              i64 %argl, i64 %arrc, i64 %i) noinline {
entry:
  %cnt = alloca i64, i64 %argl, align 8
  %arr = alloca ptr, i64 %arrc, align 8
  %bytes = shl i64 %argl, 3
  call void @llvm.memcpy.p0.p0.i64(ptr %cnt, ptr %dims, i64 %bytes, i1 false)
  store i64 1, ptr %cnt, align 8
  br label %ah
ah:
  %a = phi i64 [0, %entry], [%a1, %ab]
  %am = icmp ult i64 %a, %arrc
  br i1 %am, label %ab, label %go
ab:
  %bp = getelementptr ptr, ptr %args, i64 %a
  %base = load ptr, ptr %bp, align 8
  %sp = getelementptr i64, ptr %steps, i64 %a
  %st = load i64, ptr %sp, align 8
  %off = mul i64 %st, %i
  %np = getelementptr i8, ptr %base, i64 %off
  %dst = getelementptr ptr, ptr %arr, i64 %a
  store ptr %np, ptr %dst, align 8
  %a1 = add i64 %a, 1
  br label %ah
go:
  call void %fn(ptr %arr, ptr %cnt, ptr %steps, ptr %data)
  ret void
}

; claim and run parts of the current task until none is left (thread %k: 0 the caller)
define private void @claim(i64 %k) noinline {
entry:
  br label %top
top:
  %v = load atomic i64, ptr @tfrt_py_pool_next acquire, align 8
  %idx = and i64 %v, 4294967295
  %n = load atomic i64, ptr @tfrt_py_pool_n monotonic, align 8
  %nth = load atomic i64, ptr @tfrt_py_pool_nth monotonic, align 8
  %more = icmp ult i64 %idx, %n
  %mine = icmp ult i64 %k, %nth
  %go = and i1 %more, %mine
  br i1 %go, label %read, label %done
read:
  %fn = load atomic ptr, ptr @tfrt_py_pool_fn monotonic, align 8
  %args = load atomic ptr, ptr @tfrt_py_pool_args monotonic, align 8
  %dims = load atomic ptr, ptr @tfrt_py_pool_dims monotonic, align 8
  %steps = load atomic ptr, ptr @tfrt_py_pool_steps monotonic, align 8
  %data = load atomic ptr, ptr @tfrt_py_pool_data monotonic, align 8
  %argl = load atomic i64, ptr @tfrt_py_pool_argl monotonic, align 8
  %arrc = load atomic i64, ptr @tfrt_py_pool_arrc monotonic, align 8
  %v1 = add i64 %v, 1
  %r = cmpxchg ptr @tfrt_py_pool_next, i64 %v, i64 %v1 acq_rel monotonic
  %ok = extractvalue { i64, i1 } %r, 1
  br i1 %ok, label %run, label %top
run:
  call void @run_part(ptr %fn, ptr %args, ptr %dims, ptr %steps, ptr %data,
                      i64 %argl, i64 %arrc, i64 %idx)
  %old = atomicrmw sub ptr @tfrt_py_pool_pending, i32 1 seq_cst
  %last = icmp eq i32 %old, 1
  br i1 %last, label %check, label %top
check:
  %w = load atomic i32, ptr @tfrt_py_pool_waiting seq_cst, align 4
  %isw = icmp ne i32 %w, 0
  br i1 %isw, label %wake, label %top
wake:
  %x = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 202, ptr @tfrt_py_pool_pending,
                                                 i64 129, i64 1)
  br label %top
done:
  ret void
}

define ptr @tfrt_py_pool_worker(ptr %arg) {
entry:
  %k = ptrtoint ptr %arg to i64
  %self = call i64 @tfrt_py_libc_pthread_self()
  %slot = getelementptr [64 x i64], ptr @tfrt_py_pool_wtid, i64 0, i64 %k
  store atomic i64 %self, ptr %slot seq_cst, align 8
  %word = getelementptr [64 x [16 x i32]], ptr @tfrt_py_pool_wake, i64 0, i64 %k, i64 0
  %asleep = getelementptr [64 x [16 x i32]], ptr @tfrt_py_pool_wake, i64 0, i64 %k, i64 1
  br label %loop
loop:
  %seen = load atomic i32, ptr %word seq_cst, align 4
  call void @claim(i64 %k)
  br label %sleep
sleep:
  store atomic i32 1, ptr %asleep seq_cst, align 4
  %g = load atomic i32, ptr %word seq_cst, align 4
  %same = icmp eq i32 %g, %seen
  br i1 %same, label %wait, label %woke
wait:
  %seen64 = zext i32 %seen to i64
  %y = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 202, ptr %word, i64 128, i64 %seen64,
                                                 ptr null)
  br label %woke
woke:
  store atomic i32 0, ptr %asleep seq_cst, align 4
  %g2 = load atomic i32, ptr %word seq_cst, align 4
  %again = icmp eq i32 %g2, %seen
  br i1 %again, label %sleep, label %loop
}

define void @tfrt_py_parallel_for(ptr %fn, ptr %args, ptr %dims, ptr %steps, ptr %data,
                                  i64 %inner, i64 %arrc, i64 %nthreads) {
entry:
  %n = load i64, ptr %dims, align 8
  %nw = load atomic i64, ptr @tfrt_py_pool_nworkers monotonic, align 8
  %one = icmp sle i64 %nthreads, 1
  %few = icmp ule i64 %n, 1
  %big = icmp uge i64 %n, 2147483648
  %none = icmp eq i64 %nw, 0
  %c1 = or i1 %one, %few
  %c2 = or i1 %c1, %none
  %c3 = or i1 %c2, %big
  br i1 %c3, label %serial, label %take
take:
  %self = call i64 @tfrt_py_libc_pthread_self()
  %r = cmpxchg ptr @tfrt_py_pool_owner, i64 0, i64 %self acquire monotonic
  %ok = extractvalue { i64, i1 } %r, 1
  br i1 %ok, label %publish, label %serial
serial:
  call void %fn(ptr %args, ptr %dims, ptr %steps, ptr %data)
  ret void
publish:
  %all = add i64 %nw, 1
  %lt = icmp slt i64 %nthreads, %all
  %nth = select i1 %lt, i64 %nthreads, i64 %all
  %argl = add i64 %inner, 1
  store atomic ptr %fn, ptr @tfrt_py_pool_fn monotonic, align 8
  store atomic ptr %args, ptr @tfrt_py_pool_args monotonic, align 8
  store atomic ptr %dims, ptr @tfrt_py_pool_dims monotonic, align 8
  store atomic ptr %steps, ptr @tfrt_py_pool_steps monotonic, align 8
  store atomic ptr %data, ptr @tfrt_py_pool_data monotonic, align 8
  store atomic i64 %argl, ptr @tfrt_py_pool_argl monotonic, align 8
  store atomic i64 %arrc, ptr @tfrt_py_pool_arrc monotonic, align 8
  store atomic i64 %n, ptr @tfrt_py_pool_n monotonic, align 8
  store atomic i64 %nth, ptr @tfrt_py_pool_nth monotonic, align 8
  %n32 = trunc i64 %n to i32
  store atomic i32 %n32, ptr @tfrt_py_pool_pending seq_cst, align 4
  %g = load atomic i32, ptr @tfrt_py_pool_gen monotonic, align 4
  %g1 = add i32 %g, 1
  %g64 = zext i32 %g1 to i64
  %nx = shl i64 %g64, 32
  store atomic i64 %nx, ptr @tfrt_py_pool_next release, align 8
  store atomic i32 %g1, ptr @tfrt_py_pool_gen monotonic, align 4
  br label %kh
kh:
  ; workers 1 .. nth-1 are told, each on its own futex word; a sleeping one is woken
  %kk = phi i64 [1, %publish], [%kk1, %kn]
  %km = icmp ult i64 %kk, %nth
  br i1 %km, label %kb, label %work
kb:
  %kword = getelementptr [64 x [16 x i32]], ptr @tfrt_py_pool_wake, i64 0, i64 %kk, i64 0
  %kasleep = getelementptr [64 x [16 x i32]], ptr @tfrt_py_pool_wake, i64 0, i64 %kk, i64 1
  store atomic i32 %g1, ptr %kword seq_cst, align 4
  %ks = load atomic i32, ptr %kasleep seq_cst, align 4
  %kz = icmp ne i32 %ks, 0
  br i1 %kz, label %kw, label %kn
kw:
  %x = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 202, ptr %kword, i64 129, i64 1)
  br label %kn
kn:
  %kk1 = add i64 %kk, 1
  br label %kh
work:
  call void @claim(i64 0)
  %spin = load atomic i64, ptr @tfrt_py_pool_spin_c monotonic, align 8
  br label %wh
wh:
  %s = phi i64 [0, %work], [%s1, %wb], [%spin, %woke]
  %p = load atomic i32, ptr @tfrt_py_pool_pending acquire, align 4
  %fin = icmp eq i32 %p, 0
  br i1 %fin, label %out, label %wc
wc:
  %sm = icmp ult i64 %s, %spin
  br i1 %sm, label %wb, label %sleep
wb:
  call void @llvm.x86.sse2.pause()
  %s1 = add i64 %s, 1
  br label %wh
sleep:
  store atomic i32 1, ptr @tfrt_py_pool_waiting seq_cst, align 4
  %p2 = load atomic i32, ptr @tfrt_py_pool_pending seq_cst, align 4
  %fin2 = icmp eq i32 %p2, 0
  br i1 %fin2, label %woke, label %wait
wait:
  %p64 = zext i32 %p2 to i64
  %y = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 202, ptr @tfrt_py_pool_pending,
                                                 i64 128, i64 %p64, ptr null)
  br label %woke
woke:
  store atomic i32 0, ptr @tfrt_py_pool_waiting seq_cst, align 4
  br label %wh
out:
  store atomic i64 0, ptr @tfrt_py_pool_owner release, align 8
  ret void
}

; a parallel reduction's slot: 0 for the caller and any thread outside the pool, k for
; worker k
define i64 @tfrt_py_pool_thread_id() {
entry:
  %self = call i64 @tfrt_py_libc_pthread_self()
  %nw = load atomic i64, ptr @tfrt_py_pool_nworkers monotonic, align 8
  br label %head
head:
  %k = phi i64 [1, %entry], [%k1, %next]
  %in = icmp ule i64 %k, %nw
  br i1 %in, label %body, label %zero
body:
  %slot = getelementptr [64 x i64], ptr @tfrt_py_pool_wtid, i64 0, i64 %k
  %t = load atomic i64, ptr %slot monotonic, align 8
  %is = icmp eq i64 %t, %self
  br i1 %is, label %found, label %next
next:
  %k1 = add i64 %k, 1
  br label %head
found:
  ret i64 %k
zero:
  ret i64 0
}
"""


def installed() -> bool:
    """Whether numba's parallel loops run on this pool in this process."""
    return bool(_STATE)


def workers() -> int:
    """The pool's worker threads (0 when not installed)."""
    return int(_STATE.get("workers", 0))


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
        import llvmlite.binding as llvm

        libc = ctypes.CDLL(None)
        for name in ("syscall", "pthread_self"):
            where = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
            llvm.add_symbol(f"tfrt_py_libc_{name}", where)
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_triple(llvm.get_process_triple())
        tm = target.create_target_machine(opt=2)
        mod = llvm.parse_assembly(_IR)
        mod.verify()
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.finalize_object()
    except Exception as e:  # noqa: BLE001 - no JIT here: numba's layer keeps its own pool
        _DECLINED[:] = [f"llvmlite could not build the pool ({type(e).__name__})"]
        return False
    addr = {n: engine.get_function_address(n) for n in
            ("tfrt_py_parallel_for", "tfrt_py_pool_thread_id", "tfrt_py_pool_worker",
             "tfrt_py_pool_pause")}  # fmt: skip
    glob = {
        n: engine.get_global_value_address(f"tfrt_py_pool_{n}")
        for n in ("n", "owner", "wake", "waiting", "nworkers", "spin_c")
    }
    _STATE.update(engine=engine, addr=addr, glob=glob, libc=libc, workers=0, want=want)
    _set_spins()
    _start_workers()
    llvm.add_symbol("numba_parallel_for", addr["tfrt_py_parallel_for"])
    llvm.add_symbol("get_thread_id", addr["tfrt_py_pool_thread_id"])
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


def _start_workers() -> None:
    """Start the workers (detached pthreads running ``tfrt_py_pool_worker(k)``), then
    publish their count: loops use them from the next one on."""
    libc = _STATE["libc"]
    create, detach = libc.pthread_create, libc.pthread_detach
    vp = ctypes.c_void_p
    create.argtypes = [ctypes.POINTER(ctypes.c_ulong), vp, vp, vp]
    detach.argtypes = [ctypes.c_ulong]
    cpus = sorted(os.sched_getaffinity(0))
    pin = len(cpus) == _STATE["want"] + 1
    started = 0
    for k in range(1, _STATE["want"] + 1):
        tid = ctypes.c_ulong()
        if create(ctypes.byref(tid), None, _STATE["addr"]["tfrt_py_pool_worker"], k) != 0:
            break
        if pin:
            _pin(libc, tid.value, cpus[k % len(cpus)])
        detach(tid.value)
        started = k
    _STATE["workers"] = started
    _i64("nworkers").value = started


def _pin(libc: Any, thread: int, cpu: int) -> None:
    """Worker ``thread`` runs on ``cpu`` only (a failure leaves it unpinned)."""
    mask = (ctypes.c_uint64 * 16)()  # a cpu_set_t: 1024 CPUs
    if cpu < 1024:
        mask[cpu // 64] = 1 << (cpu % 64)
        libc.pthread_setaffinity_np(ctypes.c_ulong(thread), ctypes.c_size_t(128), mask)


def _after_fork_in_child() -> None:
    """The child has only the forking thread: no task (no part to claim), a free slot,
    no sleeping workers; then workers of its own."""
    _i64("nworkers").value = 0
    _i64("n").value = 0
    _i64("owner").value = 0
    ctypes.memset(_STATE["glob"]["wake"], 0, 64 * 64)
    _i32("waiting").value = 0
    _start_workers()
