; tfrt_py's native pool for numba's parallel loops (concurrency/native_pool.py loads this
; file, compiles it with llvmlite's MCJIT once per process and binds numba's
; `numba_parallel_for` and `get_thread_id` to @tfrt_py_parallel_for and
; @tfrt_py_pool_thread_id). Read native_pool.py's docstring first: the protocol in prose.
;
; Roles: one *caller* at a time owns the task slot (@tfrt_py_pool_owner); up to 63
; *workers* (native threads started by native_pool.py, never holding the GIL) run parts.
;
; Invariants every function below keeps:
;  I1  The slot is owned by at most one thread: @tfrt_py_pool_owner is 0 or the owner's
;      pthread_self, set by one cmpxchg 0 -> self and cleared only by that owner.
;  I2  A task's fields (@tfrt_py_pool_fn .. @tfrt_py_pool_nth) are written only by the
;      owner, before it publishes the task's generation in @tfrt_py_pool_next (release);
;      a reader that acquired a @tfrt_py_pool_next of that generation sees them.
;  I3  @tfrt_py_pool_next = generation << 32 | next part. A part is run by the one thread
;      whose cmpxchg moves it from i to i + 1 *within one generation*, so every part runs
;      exactly once, and a worker that read an old generation's fields fails its cmpxchg
;      (the word moved on) and never runs a part of a finished task.
;  I4  @tfrt_py_pool_pending counts the parts not yet finished; the owner returns, and
;      clears the slot, only after it reads 0 (acquire): every part's writes are visible to
;      the caller when numba's loop returns.
;  I5  No lost wake-up: a sleeper first announces itself (a store of 1, seq_cst), then
;      re-reads the word it will sleep on, and the futex sleeps only while the word still
;      holds the value read; a waker first writes the word, then reads the announcement
;      (seq_cst), and wakes when it is set. Of the two orders, one sees the other.
;  I6  Worker k (1-based) runs parts only while k < the task's thread count (@..._nth):
;      a loop asked for fewer threads than the pool has never uses the others.
;  I7  A worker may read the last task's word and then a field of the next one (the owner
;      wrote it in between). The owner therefore closes the word first -- the new
;      generation with every part taken -- and writes the fields with release, read with
;      acquire: a worker that saw any new field fails its cmpxchg on the old word. Before
;      I7, one that saw the new part count (larger than the old) claimed a part the old
;      task never had, ran the new task's part, and took one from @..._pending too many:
;      the caller then waited forever (consecutive loops of different part counts).
;  I8  A worker spins for the next task (watching its word) only after it ran parts of
;      the last one that took it less than @tfrt_py_pool_short_t cycles (a wake-up would
;      cost as much as such parts), or after any parts while its wake-ups are slow: its
;      last futex wake came more than @tfrt_py_pool_wake_t cycles after the task was
;      published (@tfrt_py_pool_pub_t) -- an idle vCPU halted, 30-90 µs on a 2-core
;      Firecracker VM, paid by every kernel of a CNN -- unless it was preempted lately (a
;      busy process shares the CPU, and spinning there spends the worker's share, so its
;      next part waits behind the neighbour): a worker preempted since its last task
;      (getrusage's involuntary context switches, read once a task) tries such spins
;      again only 256 tasks later. One that ran nothing, or long parts while wake-ups are
;      fast, sleeps at once.
;      The spin starts at @tfrt_py_pool_spin_t cycles, doubles (up to 8 times that) when
;      a task comes soon after the worker went to sleep, and falls back when tasks come
;      rarely. A spin only reads the word and the time-stamp counter -- no `pause`: under
;      KVM, pause-loop exiting takes a vCPU that spins with it off the CPU, and the task
;      then waits for the host to run it again (Llama's decode-step products found the
;      worker asleep or late 2.5x as often) -- and the sleep after it is I5's.
;  I9  Pinned workers leave the caller a CPU: where native_pool.py pinned every worker
;      (worker k to @tfrt_py_pool_cpu[k]), @tfrt_py_pool_free is the one CPU of the
;      process's none holds (-1: not pinned, nothing here moves a worker). The slot's
;      owner (I1), before it tells the workers, finds the CPU it runs on; where a worker
;      is pinned there in this loop and the last (@tfrt_py_pool_hits: two callers on two
;      CPUs taking turns would otherwise move a worker every loop, ~10 µs each), that
;      worker moves to @free (sched_setaffinity on its kernel thread id,
;      @tfrt_py_pool_ktid[k]) and the caller's CPU becomes @free. Otherwise the woken
;      worker queues behind its caller on one CPU while the other idles, and the loop runs
;      at one thread's speed (a 2-core Zen 5 VM, a 3x3 conv at batch 1: 248 against 143 µs
;      in the 38-57% of calls the scheduler had left the caller on the worker's CPU). Only
;      the owner writes these (I1); a refused move sets @free to -1 (no more moves).
;
; Linux x86-64 only: syscall 202 is futex; op 128 is FUTEX_WAIT_PRIVATE, 129
; FUTEX_WAKE_PRIVATE; `pause` is the x86 spin hint.

; --- the task slot and its fields ---------------------------------------------------------
; generation of the last task published (a worker's wake word gets this value)
@tfrt_py_pool_gen = global i32 0, align 64
; generation << 32 | next part to claim (I3); its own cache line: every claim writes it
@tfrt_py_pool_next = global i64 0, align 64
; parts not yet finished (I4); the caller's futex word once it sleeps
@tfrt_py_pool_pending = global i32 0, align 64
; 1 while the caller sleeps on @tfrt_py_pool_pending (I5)
@tfrt_py_pool_waiting = global i32 0, align 64
; pthread_self of the slot's owner, 0 when free (I1)
@tfrt_py_pool_owner = global i64 0, align 64
; the task (I2): numba's loop function and its arguments, the part count and thread count
@tfrt_py_pool_fn = global ptr null, align 64
@tfrt_py_pool_args = global ptr null, align 8
@tfrt_py_pool_dims = global ptr null, align 8
@tfrt_py_pool_steps = global ptr null, align 8
@tfrt_py_pool_data = global ptr null, align 8
@tfrt_py_pool_argl = global i64 0, align 8
@tfrt_py_pool_arrc = global i64 0, align 8
@tfrt_py_pool_n = global i64 0, align 8
@tfrt_py_pool_nth = global i64 0, align 8
; --- the pool (written by native_pool.py from Python, read here) -------------------------
; workers started (0: every loop runs in its caller)
@tfrt_py_pool_nworkers = global i64 0, align 64
; the caller's spin on the parts in flight, in `pause` instructions, before it sleeps
@tfrt_py_pool_spin_c = global i64 0, align 8
; a worker's first spin for the next task, in time-stamp cycles, before it sleeps (I8)
@tfrt_py_pool_spin_t = global i64 0, align 8
; parts shorter than this many cycles (the time-stamp counter's) are followed by a spin (I8)
@tfrt_py_pool_short_t = global i64 0, align 8
; a wake-up later than this many cycles after the publish is slow (I8)
@tfrt_py_pool_wake_t = global i64 0, align 8
; the time-stamp counter when the last task was published (I8; the owner writes it)
@tfrt_py_pool_pub_t = global i64 0, align 8
; pthread_self of worker k at [k] (for @tfrt_py_pool_thread_id)
@tfrt_py_pool_wtid = global [64 x i64] zeroinitializer, align 64
; the CPU no worker is pinned to, -1 where the workers are not pinned (I9)
@tfrt_py_pool_free = global i32 -1, align 64
; loops in a row whose owner ran on a pinned worker's CPU (I9)
@tfrt_py_pool_hits = global i32 0, align 4
; worker k's CPU at [k] (I9; meaningful only while @tfrt_py_pool_free >= 0)
@tfrt_py_pool_cpu = global [64 x i32] zeroinitializer, align 64
; worker k's kernel thread id at [k], 0 until it started (I9)
@tfrt_py_pool_ktid = global [64 x i32] zeroinitializer, align 64
; per worker, a cache line: [0] the futex word a task's generation is written to, [1] 1
; while the worker sleeps on it
@tfrt_py_pool_wake = global [64 x [16 x i32]] zeroinitializer, align 64

; libc's syscall, pthread_self and sched_getcpu, registered under these names by native_pool.py
declare i64 @tfrt_py_libc_syscall(i64, ...)
declare i64 @tfrt_py_libc_pthread_self()
declare void @llvm.x86.sse2.pause()
declare i64 @llvm.readcyclecounter()
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
declare i32 @tfrt_py_libc_sched_getcpu()

; %n `pause` instructions: an opaque spin for tests and benchmarks (pause_address()).
; Touches no state.
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

; the time-stamp counter, for native_pool.py to measure its rate. Touches no state.
define i64 @tfrt_py_pool_cycles() {
entry:
  %t = call i64 @llvm.readcyclecounter()
  ret i64 %t
}

; part %i of the task: the loop function over one schedule row, its array arguments
; advanced by %i steps (as numba's TBB parallel_for does per range).
; Invariant: reads only the task fields its caller passed (read under I2 and claimed under
; I3); the counts and the advanced pointers live on this thread's stack.
define private void @run_part(ptr %fn, ptr %args, ptr %dims, ptr %steps, ptr %data,
                              i64 %argl, i64 %arrc, i64 %i) noinline {
entry:
  %cnt = alloca i64, i64 %argl, align 8
  %arr = alloca ptr, i64 %arrc, align 8
  %bytes = shl i64 %argl, 3
  call void @llvm.memcpy.p0.p0.i64(ptr %cnt, ptr %dims, i64 %bytes, i1 false)
  ; one schedule row: the outer dimension of this part is 1
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

; claim and run parts of the current task until none is left (thread %k: 0 the caller);
; returns how many this thread ran.
; Invariant: runs a part only after its own cmpxchg claimed it (I3) and only while
; %k < nth (I6); the thread that finishes the last part wakes a sleeping caller (I4, I5).
define private i64 @claim(i64 %k) noinline {
entry:
  br label %top
top:
  %ran = phi i64 [0, %entry], [%ran, %read], [%ran1, %run], [%ran1, %check], [%ran1, %wake]
  ; acquire: pairs with the owner's release store of a new generation (I2)
  %v = load atomic i64, ptr @tfrt_py_pool_next acquire, align 8
  %idx = and i64 %v, 4294967295
  ; acquire: a count of a newer task than %v's implies the word was closed (I7), so the
  ; cmpxchg below fails rather than claim a part %v's task never had
  %n = load atomic i64, ptr @tfrt_py_pool_n acquire, align 8
  %nth = load atomic i64, ptr @tfrt_py_pool_nth acquire, align 8
  %more = icmp ult i64 %idx, %n
  %mine = icmp ult i64 %k, %nth
  %go = and i1 %more, %mine
  br i1 %go, label %read, label %done
read:
  ; monotonic: fields of the generation in %v, ordered by its acquire (I2); stale only if
  ; the generation moved on, which makes the cmpxchg below fail (I3)
  %fn = load atomic ptr, ptr @tfrt_py_pool_fn acquire, align 8
  %args = load atomic ptr, ptr @tfrt_py_pool_args acquire, align 8
  %dims = load atomic ptr, ptr @tfrt_py_pool_dims acquire, align 8
  %steps = load atomic ptr, ptr @tfrt_py_pool_steps acquire, align 8
  %data = load atomic ptr, ptr @tfrt_py_pool_data acquire, align 8
  %argl = load atomic i64, ptr @tfrt_py_pool_argl acquire, align 8
  %arrc = load atomic i64, ptr @tfrt_py_pool_arrc acquire, align 8
  %v1 = add i64 %v, 1
  ; acq_rel: the claim of part %idx of generation %v (I3); fails if anyone moved the word
  %r = cmpxchg ptr @tfrt_py_pool_next, i64 %v, i64 %v1 acq_rel monotonic
  %ok = extractvalue { i64, i1 } %r, 1
  br i1 %ok, label %run, label %top
run:
  call void @run_part(ptr %fn, ptr %args, ptr %dims, ptr %steps, ptr %data,
                      i64 %argl, i64 %arrc, i64 %idx)
  %ran1 = add i64 %ran, 1
  ; seq_cst: publishes the part's writes to the caller's acquire of 0 (I4), and orders
  ; before the read of @tfrt_py_pool_waiting (I5, the waker's side)
  %old = atomicrmw sub ptr @tfrt_py_pool_pending, i32 1 seq_cst
  %last = icmp eq i32 %old, 1
  br i1 %last, label %check, label %top
check:
  ; seq_cst: I5, the waker reads the caller's announcement after its own write
  %w = load atomic i32, ptr @tfrt_py_pool_waiting seq_cst, align 4
  %isw = icmp ne i32 %w, 0
  br i1 %isw, label %wake, label %top
wake:
  ; FUTEX_WAKE_PRIVATE one waiter on @tfrt_py_pool_pending: the caller
  %x = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 202, ptr @tfrt_py_pool_pending,
                                                 i64 129, i64 1)
  br label %top
done:
  ret i64 %ran
}

; worker %arg (k >= 1) forever: claim parts, then sleep on its wake word until a new
; generation is written there. Never returns; never holds the GIL.
; Invariant: sleeps only while its word still holds the generation it last served (I5), so
; a task published between its claim and its sleep is never missed.
define ptr @tfrt_py_pool_worker(ptr %arg) {
entry:
  %k = ptrtoint ptr %arg to i64
  %self = call i64 @tfrt_py_libc_pthread_self()
  %slot = getelementptr [64 x i64], ptr @tfrt_py_pool_wtid, i64 0, i64 %k
  ; seq_cst: the id is visible before this worker runs any part (get_thread_id)
  store atomic i64 %self, ptr %slot seq_cst, align 8
  ; gettid: the kernel thread id a caller re-pins this worker by (I9)
  %kt = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 186)
  %kt32 = trunc i64 %kt to i32
  %ktp = getelementptr [64 x i32], ptr @tfrt_py_pool_ktid, i64 0, i64 %k
  store atomic i32 %kt32, ptr %ktp seq_cst, align 4
  %word = getelementptr [64 x [16 x i32]], ptr @tfrt_py_pool_wake, i64 0, i64 %k, i64 0
  %asleep = getelementptr [64 x [16 x i32]], ptr @tfrt_py_pool_wake, i64 0, i64 %k, i64 1
  ; monotonic: tuning knobs native_pool.py sets before it starts the workers (I8)
  %base = load atomic i64, ptr @tfrt_py_pool_spin_t monotonic, align 8
  %short = load atomic i64, ptr @tfrt_py_pool_short_t monotonic, align 8
  %slow_t = load atomic i64, ptr @tfrt_py_pool_wake_t monotonic, align 8
  %most = shl i64 %base, 3
  ; tasks left before a spin for slow wake-ups may be tried again after a preemption (I8)
  %coolp = alloca i64, align 8
  store i64 0, ptr %coolp, align 8
  ; getrusage(RUSAGE_THREAD): ru_nivcsw (offset 136) counts this worker's preemptions
  %ru = alloca [18 x i64], align 8
  %nivp = getelementptr [18 x i64], ptr %ru, i64 0, i64 17
  ; 0 where the call fails (a sandbox without getrusage): never counted as preempted
  store i64 0, ptr %nivp, align 8
  %ru0 = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 98, i64 1, ptr %ru)
  %niv0 = load i64, ptr %nivp, align 8
  %nivlast = alloca i64, align 8
  store i64 %niv0, ptr %nivlast, align 8
  br label %loop
loop:
  ; %lim: this worker's spin after short parts, in cycles (I8: adapted at each wake-up)
  %lim = phi i64 [%base, %entry], [%lim, %ws], [%lim2, %adapt]
  ; %slow: its last wake-up was slow (I8)
  %slow = phi i1 [false, %entry], [%slow, %ws], [%slow2, %adapt]
  ; seq_cst: the generation this round serves, read before claiming (I5)
  %seen = load atomic i32, ptr %word seq_cst, align 4
  %t0 = call i64 @llvm.readcyclecounter()
  %got = call i64 @claim(i64 %k)
  %t1 = call i64 @llvm.readcyclecounter()
  ; I8: spin only after running short parts
  %took = sub i64 %t1, %t0
  %ran = icmp ne i64 %got, 0
  %quick = icmp ult i64 %took, %short
  ; I8: preempted since the last task (a busy process shares the CPU): no spin for slow
  ; wake-ups over the next 256 tasks
  %rus = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 98, i64 1, ptr %ru)
  %niv = load i64, ptr %nivp, align 8
  %nivw = load i64, ptr %nivlast, align 8
  store i64 %niv, ptr %nivlast, align 8
  %bumped = icmp ne i64 %niv, %nivw
  %cool = load i64, ptr %coolp, align 8
  %cool1 = sub i64 %cool, 1
  %cool0 = icmp eq i64 %cool, 0
  %cooldec = select i1 %cool0, i64 0, i64 %cool1
  %cool2 = select i1 %bumped, i64 256, i64 %cooldec
  store i64 %cool2, ptr %coolp, align 8
  %cooled = icmp eq i64 %cool2, 0
  %slowok = and i1 %slow, %cooled
  %worth = or i1 %quick, %slowok
  %spins = and i1 %ran, %worth
  %l = select i1 %spins, i64 %lim, i64 0
  br label %ws
ws:
  ; the next task's word, watched for %l cycles (I8); a new generation: serve it
  %gs = load atomic i32, ptr %word seq_cst, align 4
  %moved = icmp ne i32 %gs, %seen
  br i1 %moved, label %loop, label %wsc
wsc:
  %now = call i64 @llvm.readcyclecounter()
  %spent = sub i64 %now, %t1
  %more = icmp ult i64 %spent, %l
  br i1 %more, label %wsp, label %sleep
wsp:
  ; no `pause` here (I8)
  br label %ws
sleep:
  %ts = call i64 @llvm.readcyclecounter()
  ; seq_cst store then load: I5, the sleeper's side (announce, then re-read the word)
  store atomic i32 1, ptr %asleep seq_cst, align 4
  %g = load atomic i32, ptr %word seq_cst, align 4
  %same = icmp eq i32 %g, %seen
  br i1 %same, label %wait, label %woke
wait:
  ; FUTEX_WAIT_PRIVATE while *word == seen (no timeout)
  %seen64 = zext i32 %seen to i64
  %y = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 202, ptr %word, i64 128, i64 %seen64,
                                                 ptr null)
  br label %woke
woke:
  ; seq_cst: cleared before the re-read, so a waker that writes after it wakes again
  store atomic i32 0, ptr %asleep seq_cst, align 4
  %g2 = load atomic i32, ptr %word seq_cst, align 4
  %again = icmp eq i32 %g2, %seen
  br i1 %again, label %sleep, label %adapt
adapt:
  ; I8: a task that came within 4 spins of the sleep doubles the spin (at most 8 times
  ; the base); one that came after 64 of the longest spins resets it to the base
  %tw = call i64 @llvm.readcyclecounter()
  %slept = sub i64 %tw, %ts
  ; monotonic: any publish time read is a valid guess (I8)
  %pub = load atomic i64, ptr @tfrt_py_pool_pub_t monotonic, align 8
  %lat = sub i64 %tw, %pub
  %slow2 = icmp ugt i64 %lat, %slow_t
  %lim4 = shl i64 %lim, 2
  %soon = icmp ult i64 %slept, %lim4
  %dbl = shl i64 %lim, 1
  %cap = icmp ugt i64 %dbl, %most
  %grown = select i1 %cap, i64 %most, i64 %dbl
  %most64 = shl i64 %most, 6
  %late = icmp ugt i64 %slept, %most64
  %kept = select i1 %late, i64 %base, i64 %lim
  %lim2 = select i1 %soon, i64 %grown, i64 %kept
  br label %loop
}

; numba's `numba_parallel_for(fn, args, dims, steps, data, inner_ndim, array_count,
; num_threads)` (numba/np/ufunc/gufunc_scheduler.h; the releases in NUMBA_TESTED): run
; fn over dims[0] schedule rows, on the caller and the workers.
; Invariant: takes the slot (I1) or runs everything itself (one thread or part, no
; workers, 2^31 parts or more, or the slot taken: another loop, or a loop nested in a
; part); returns only when every part finished (I4), having freed the slot.
define void @tfrt_py_parallel_for(ptr %fn, ptr %args, ptr %dims, ptr %steps, ptr %data,
                                  i64 %inner, i64 %arrc, i64 %nthreads) {
entry:
  %n = load i64, ptr %dims, align 8
  ; monotonic: written once by native_pool.py before numba can call here
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
  ; acquire: I1; pairs with the last owner's release of the slot
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
  ; monotonic: only the owner writes the generation (I1)
  %g = load atomic i32, ptr @tfrt_py_pool_gen monotonic, align 4
  %g1 = add i32 %g, 1
  %g64 = zext i32 %g1 to i64
  %nx = shl i64 %g64, 32
  ; seq_cst: I7, the new generation with no part to claim, before any field changes: a
  ; worker that read the last task's word and then a field of this one fails its cmpxchg
  %closed = or i64 %nx, 4294967295
  store atomic i64 %closed, ptr @tfrt_py_pool_next seq_cst, align 8
  ; release: the task's fields (I2, I7: a worker that reads one sees the word closed)
  store atomic ptr %fn, ptr @tfrt_py_pool_fn release, align 8
  store atomic ptr %args, ptr @tfrt_py_pool_args release, align 8
  store atomic ptr %dims, ptr @tfrt_py_pool_dims release, align 8
  store atomic ptr %steps, ptr @tfrt_py_pool_steps release, align 8
  store atomic ptr %data, ptr @tfrt_py_pool_data release, align 8
  store atomic i64 %argl, ptr @tfrt_py_pool_argl release, align 8
  store atomic i64 %arrc, ptr @tfrt_py_pool_arrc release, align 8
  store atomic i64 %n, ptr @tfrt_py_pool_n release, align 8
  store atomic i64 %nth, ptr @tfrt_py_pool_nth release, align 8
  %n32 = trunc i64 %n to i32
  ; seq_cst: every part is pending before any can be claimed (I4)
  store atomic i32 %n32, ptr @tfrt_py_pool_pending seq_cst, align 4
  ; release: publishes the fields above with part 0 of the new generation (I2, I3)
  store atomic i64 %nx, ptr @tfrt_py_pool_next release, align 8
  store atomic i32 %g1, ptr @tfrt_py_pool_gen monotonic, align 4
  ; I9: no worker told below waits for the caller's CPU
  call void @place(i64 %nw)
  ; monotonic: the workers' wake-up clock (I8), before any is told
  %tp = call i64 @llvm.readcyclecounter()
  store atomic i64 %tp, ptr @tfrt_py_pool_pub_t monotonic, align 8
  br label %kh
kh:
  ; workers 1 .. nth-1 are told, each on its own futex word; a sleeping one is woken (I6)
  %kk = phi i64 [1, %publish], [%kk1, %kn]
  %km = icmp ult i64 %kk, %nth
  br i1 %km, label %kb, label %work
kb:
  %kword = getelementptr [64 x [16 x i32]], ptr @tfrt_py_pool_wake, i64 0, i64 %kk, i64 0
  %kasleep = getelementptr [64 x [16 x i32]], ptr @tfrt_py_pool_wake, i64 0, i64 %kk, i64 1
  ; seq_cst store then load: I5, the waker's side (write the word, then read the flag)
  store atomic i32 %g1, ptr %kword seq_cst, align 4
  %ks = load atomic i32, ptr %kasleep seq_cst, align 4
  %kz = icmp ne i32 %ks, 0
  br i1 %kz, label %kw, label %kn
kw:
  ; FUTEX_WAKE_PRIVATE worker kk
  %x = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 202, ptr %kword, i64 129, i64 1)
  br label %kn
kn:
  %kk1 = add i64 %kk, 1
  br label %kh
work:
  %mine0 = call i64 @claim(i64 0)
  ; monotonic: a tuning knob native_pool.py sets; any value read is valid
  %spin = load atomic i64, ptr @tfrt_py_pool_spin_c monotonic, align 8
  br label %wh
wh:
  ; the parts in flight: spin %spin pauses, then sleep on @tfrt_py_pool_pending
  %s = phi i64 [0, %work], [%s1, %wb], [%spin, %woke]
  ; acquire: pairs with the parts' seq_cst decrements: their writes are visible (I4)
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
  ; seq_cst store then load: I5, the sleeper's side
  store atomic i32 1, ptr @tfrt_py_pool_waiting seq_cst, align 4
  %p2 = load atomic i32, ptr @tfrt_py_pool_pending seq_cst, align 4
  %fin2 = icmp eq i32 %p2, 0
  br i1 %fin2, label %woke, label %wait
wait:
  ; FUTEX_WAIT_PRIVATE while pending == p2 (no timeout)
  %p64 = zext i32 %p2 to i64
  %y = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 202, ptr @tfrt_py_pool_pending,
                                                 i64 128, i64 %p64, ptr null)
  br label %woke
woke:
  ; seq_cst: the flag is down before the next read of pending (I5)
  store atomic i32 0, ptr @tfrt_py_pool_waiting seq_cst, align 4
  br label %wh
out:
  ; release: I1, the slot freed after every part finished (I4)
  store atomic i64 0, ptr @tfrt_py_pool_owner release, align 8
  ret void
}

; I9: where a worker is pinned to the CPU the slot's owner runs on (this loop and the
; last), move it to the free CPU, which becomes the owner's. Called by the owner only
; (I1), before it tells the workers; one sched_getcpu a loop, a syscall only when the
; caller stayed on a worker's CPU.
define private void @place(i64 %nw) noinline {
entry:
  %mask = alloca [16 x i64], align 8
  ; monotonic: only the owner writes it (I1, I9)
  %free = load atomic i32, ptr @tfrt_py_pool_free monotonic, align 4
  %pinned = icmp sge i32 %free, 0
  br i1 %pinned, label %where, label %done
where:
  %here = call i32 @tfrt_py_libc_sched_getcpu()
  %valid = icmp sge i32 %here, 0
  %away = icmp ne i32 %here, %free
  %look = and i1 %valid, %away
  br i1 %look, label %head, label %clear
clear:
  store atomic i32 0, ptr @tfrt_py_pool_hits monotonic, align 4
  br label %done
head:
  %k = phi i64 [1, %where], [%k1, %next]
  %in = icmp ule i64 %k, %nw
  br i1 %in, label %body, label %clear
body:
  %cp = getelementptr [64 x i32], ptr @tfrt_py_pool_cpu, i64 0, i64 %k
  %c = load atomic i32, ptr %cp monotonic, align 4
  %hit = icmp eq i32 %c, %here
  br i1 %hit, label %count, label %next
next:
  %k1 = add i64 %k, 1
  br label %head
count:
  ; monotonic: only the owner reads and writes it (I1)
  %h = load atomic i32, ptr @tfrt_py_pool_hits monotonic, align 4
  %h1 = add i32 %h, 1
  %again = icmp sge i32 %h1, 2
  br i1 %again, label %move, label %first
first:
  store atomic i32 %h1, ptr @tfrt_py_pool_hits monotonic, align 4
  br label %done
move:
  store atomic i32 0, ptr @tfrt_py_pool_hits monotonic, align 4
  ; seq_cst: pairs with the worker's store of its id at its start
  %tp = getelementptr [64 x i32], ptr @tfrt_py_pool_ktid, i64 0, i64 %k
  %tid = load atomic i32, ptr %tp seq_cst, align 4
  %known = icmp sgt i32 %tid, 0
  br i1 %known, label %set, label %done
set:
  ; a cpu_set_t of 1024 CPUs holding @free alone (native_pool.py pins below 1024 only)
  call void @llvm.memset.p0.i64(ptr %mask, i8 0, i64 128, i1 false)
  %f64 = zext i32 %free to i64
  %word = lshr i64 %f64, 6
  %bit = and i64 %f64, 63
  %one = shl i64 1, %bit
  %wp = getelementptr [16 x i64], ptr %mask, i64 0, i64 %word
  store i64 %one, ptr %wp, align 8
  %tid64 = sext i32 %tid to i64
  ; sched_setaffinity(tid, 128, mask)
  %r = call i64 (i64, ...) @tfrt_py_libc_syscall(i64 203, i64 %tid64, i64 128, ptr %mask)
  %ok = icmp eq i64 %r, 0
  br i1 %ok, label %moved, label %off
moved:
  store atomic i32 %free, ptr %cp monotonic, align 4
  store atomic i32 %here, ptr @tfrt_py_pool_free monotonic, align 4
  br label %done
off:
  ; refused (the CPU left the process's affinity since): workers stay where they are
  store atomic i32 -1, ptr @tfrt_py_pool_free monotonic, align 4
  br label %done
done:
  ret void
}

; a parallel reduction's slot: 0 for the caller and any thread outside the pool, k for
; worker k. Invariant: reads only worker ids, each written once before that worker runs
; a part; a thread never sees another thread's slot.
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
  ; monotonic: a worker's own id was stored (seq_cst) before it ran this
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
