"""StreamedProgram: run a model whose weights stream from disk, stage by stage.

The scheme (bulk inference, stage-major): batches are taken from the caller's iterable in
*windows* of ``window`` batches. For each window, stage 0..S-1 run in order; each stage's
weights are loaded once and every batch of the window runs through it before the next
stage. While stage ``s`` computes, the transfer kernel (``transfer.Transfers``, on a
HostContext worker) reads the next step's weights into the other region of the arena;
after the window's last stage the next window's stage 0 is already being read, so the
pipeline stays full across windows instead of restarting per batch. Memory: the arena
(at most ``memory_budget`` minus the resident constants) plus, per batch of the window,
the activations that cross a stage boundary, plus one stage's intermediates for one batch.
The next window's feeds are pulled from the iterable when the current window's last stage
starts (so its stage-0 read can begin); the window's results are yielded after its last
stage.

Threads: the sync form computes on the caller's thread; the async form computes each
(stage, window) step as one work item on the host's pool and awaits it, so the event loop
only schedules. Either way reads run on the host's workers. One run at a time holds the
arena (a FIFO ``Gate``; each run has a ``Lease``); a run waits for its in-flight reads
(and, async, its in-flight compute) to end before the next run is let in. No lock is held
across a yield: while a run hands a result to its consumer or pulls batches from the
consumer's iterable it is *parked*, and a call that wants the arena then preempts it (its
reads are stopped and drained). The preempted run keeps its own state -- feeds,
activations, its place in the window -- and, when it continues, waits for the arena again
and re-reads the weights of the steps it had not computed (``_Run.restart``). So an
abandoned, slow or interleaved iterator never blocks another call.
"""

from __future__ import annotations

import functools
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Any

import numpy as np

from ..calls import CallContext, set_current
from ..compiler.prepare import Prepared
from ..concurrency import AsyncValue, HostContext, default_host, run_when_ready
from ..errors import InputError
from ..executors.base import Executor
from ..executors.program import user_output
from ..feeds import FeedChecker, fill_outputs
from ..ir import Graph, Value
from ..records import record
from .gate import Gate, Lease
from .partition import Stage
from .rows import read_rows
from .transfer import Transfers, WeightArena

__all__ = ["DEFAULT_WINDOW", "StreamInfo", "StreamStats", "StreamedProgram", "run_each_async"]

#: Batches per window when the caller does not say.
DEFAULT_WINDOW = 4


@record
class StreamStats:
    """One run's figures. ``compute_s``: stage compute summed; ``transfer_s``: reads summed
    (the disk's busy time, reads are sequential; ``first_transfer_s`` the first stage's,
    which nothing overlaps); ``wait_s``: compute waiting for reads;
    ``wall_s``: the run from its first feed to its last result."""

    batches: int = 0
    windows: int = 0
    steps: int = 0
    compute_s: float = 0.0
    transfer_s: float = 0.0
    first_transfer_s: float = 0.0
    wait_s: float = 0.0
    wall_s: float = 0.0
    bytes_read: int = 0
    reads: int = 0
    overlap: bool = True
    #: bytes the row-gather stages read (also in ``bytes_read``), on the computing thread
    row_bytes: int = 0

    def summary(self) -> str:
        return (
            f"{self.batches} batch(es) in {self.windows} window(s), {self.steps} stage steps "
            f"({self.reads} stage reads): wall {self.wall_s * 1e3:.1f} ms, "
            f"compute {self.compute_s * 1e3:.1f} ms, transfer {self.transfer_s * 1e3:.1f} ms "
            f"({self.bytes_read / 1e6:.1f} MB, {self.row_bytes / 1e6:.1f} MB of it by rows), "
            f"waiting for transfer {self.wait_s * 1e3:.1f} ms"
            f"{'' if self.overlap else ', overlap off'}"
        )


@record(frozen=True)
class StreamInfo:
    """Load-time facts for ``describe()``: the budget, the streamed weights (bytes, tensors,
    files), the constants that stay resident, and the arena's size."""

    budget: int
    weight_bytes: int
    n_weights: int
    n_files: int
    resident_bytes: int
    arena_bytes: int
    #: bytes of the row-read tables (``rows.py``): read by rows, never into the arena
    row_bytes: int = 0


# What the run's step generator asks its driver for.
@record
class _Need:  # the next window: a list of raw feeds (empty at the end)
    n: int


@record
class _Wait:  # the value of this AsyncValue
    av: AsyncValue[Any]


@record
class _Compute:  # run fn() (sync: inline; async: on the pool), send back nothing
    fn: Callable[[], None]


@record
class _Emit:  # hand these results to the caller; ``final``: the run uses the arena no more
    results: list[dict[str, np.ndarray]]
    final: bool


_Op = _Need | _Wait | _Compute | _Emit


class _Steps:
    """Iterates the steps a ``_Run`` yields (``_Need``, ``_Wait``, ``_Compute``, ``_Emit``);
    ``reply(value)`` is sent into the run with the next step (None when nothing was). The
    one protocol loop of the sync and the async drivers; owned by the driving call."""

    __slots__ = ("_gen", "_reply")

    def __init__(self, gen: Generator[Any, Any, None]) -> None:
        self._gen = gen
        self._reply: Any = None

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> Any:
        reply, self._reply = self._reply, None
        return self._gen.send(reply)  # StopIteration ends the driver's loop

    def reply(self, value: Any) -> None:
        self._reply = value

    def close(self) -> None:
        self._gen.close()


class StreamedProgram(Executor):
    """Executor "stream": the stages of one streamed model, its arena, and the runs over
    them.

    Owns the arena and the gate; the stages' Programs are immutable. Built at load by
    ``loader.load_streamed`` (which also sets ``graph``, the model's view without the
    weight inputs, and ``prepared``); ``Model`` delegates run/run_async/run_batches to it.
    """

    name = "stream"
    graph: Graph
    prepared: Prepared

    def __init__(
        self,
        stages: list[Stage],
        inputs: list[Value],
        outputs: list[Value],
        arena_bytes: int,
        host: HostContext | None,
        info: StreamInfo,
    ) -> None:
        self.info = info
        self.stages = stages
        self._inputs = inputs
        self._outputs = outputs
        self._check = FeedChecker(inputs)
        fixed = {id(v) for v in inputs}
        self._fixed = [id(v) in fixed or v.is_const for v in outputs]
        self.arena = WeightArena(arena_bytes)
        self._gate = Gate()
        self.host = host
        #: The last finished run's figures (None before the first run).
        self.last_stats: StreamStats | None = None
        #: Drop each weight's pages from the OS page cache after reading it (see transfer).
        self.drop_cache = True

    def describe_lines(self) -> list[str]:
        """``describe()`` lines: the budget, the arena, one line per stage, the last run."""
        i = self.info
        lines = [
            f"  streaming: {i.n_weights} weight tensors, {_size(i.weight_bytes)} in "
            f"{i.n_files} file(s), over memory_budget {_size(i.budget)}; read by stage into a "
            "weight arena, the next stage's read overlapping this stage's compute",
            f"    weight arena {_size(i.arena_bytes)} (two regions), resident constants "
            f"{_size(i.resident_bytes)}; run_batches window default {DEFAULT_WINDOW}",
        ]
        if i.row_bytes:
            lines.append(
                f"    {_size(i.row_bytes)} of tables read only by Gathers of rows: "
                "each reads its rows from disk when it runs, not streamed whole"
            )
        for st in self.stages:
            if st.gather is not None:
                r = st.gather.ref
                lines.append(
                    f"    stage {st.index}: Gather of rows of {r.name!r:.80} "
                    f"({_size(r.nbytes)} table), read by rows"
                )
                continue
            lines.append(
                f"    stage {st.index}: {len(st.nodes)} nodes ({st.op_summary()}), "
                f"{len(st.weights)} weights {_size(st.nbytes)}, est. "
                f"{st.flops / 1e6:.2f} MFLOP per batch (symbolic dims as 1)"
            )
        if self.last_stats is not None:
            lines.append(f"    last run: {self.last_stats.summary()}")
        return lines

    # -- the sync form ------------------------------------------------------------------------
    def run_batches(
        self,
        feeds: Iterable[Mapping[str, Any]],
        window: int | None = None,
        overlap: bool = True,
        chained: bool = False,
    ) -> Generator[dict[str, np.ndarray], None, None]:
        """Results per batch, in order; runs on the calling thread as it is iterated. While
        the consumer holds a result or the feeds iterable is producing the next batches, the
        run is parked: another call that needs the arena preempts it (see ``gate``).
        ``chained``: each window's feeds are taken only after the window before was handed
        over (they may depend on its results: ``chain.StepChain``), and the next window's
        first stage is read while this window's last stage computes."""
        n = _window(window)
        it = iter(feeds)
        run = _Run(self, self.host or default_host(), overlap)
        _wait_for(self._gate, run.lease)
        ops = _Steps(run.steps(n, chained))
        try:
            for op in ops:
                if isinstance(op, _Need):
                    self._gate.park(run.lease)
                    ops.reply(_take(it, op.n))
                    self._resume(run)
                elif isinstance(op, _Wait):
                    ops.reply(op.av.wait())
                elif isinstance(op, _Compute):
                    op.fn()
                else:
                    for r, resume in self._handoffs(run, op):
                        yield r
                        if resume:
                            self._resume(run)
        finally:
            ops.close()
            run.finish([]).wait()

    def _handoffs(self, run: _Run, op: _Emit) -> Iterator[tuple[dict[str, np.ndarray], bool]]:
        """``op``'s results, each as (result, resume), the run parked while the caller
        holds it: the caller hands the result over, then resumes the run if ``resume``;
        after the final result of a run that needs the arena no more it is unparked here
        instead (the run ends without the arena)."""
        last = len(op.results) - 1
        for i, r in enumerate(op.results):
            self._gate.park(run.lease)
            final = op.final and i == last
            yield r, not final
            if final:
                self._gate.unpark(run.lease)

    def _resume(self, run: _Run) -> None:
        """Unpark ``run``; if it was preempted meanwhile, wait for the arena and reload."""
        if not self._gate.unpark(run.lease):
            _wait_for(self._gate, run.lease)
            run.restart()

    def run(
        self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """One batch: every stage streamed once."""
        it = self.run_batches([feeds], window=1)
        try:
            results = next(it)
        finally:
            it.close()  # the generator's finally releases the arena
        return results if outputs is None else fill_outputs(results, outputs)

    # -- the async form -----------------------------------------------------------------------
    async def run_batches_async(
        self, feeds: Any, window: int | None = None, overlap: bool = True, chained: bool = False
    ) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """Results per batch; ``feeds`` is an iterable or an async iterable. Stage compute
        runs on the host's pool; cancelling the consuming task ends the run (in-flight
        compute and reads finish before the next run may start). ``chained``: as
        ``run_batches``'."""
        n = _window(window)
        host = self.host or default_host()
        run = _Run(self, host, overlap)
        await _await_for(self._gate, run.lease)
        ops = _Steps(run.steps(n, chained))
        pending: list[AsyncValue[Any]] = []
        aiter_ = feeds.__aiter__() if hasattr(feeds, "__aiter__") else None
        it = None if aiter_ is not None else iter(feeds)
        try:
            for op in ops:
                if isinstance(op, _Need):
                    self._gate.park(run.lease)
                    ops.reply(await _take_async(aiter_, op.n) if it is None else _take(it, op.n))
                    await self._resume_async(run)
                elif isinstance(op, _Wait):
                    ops.reply(await op.av)
                elif isinstance(op, _Compute):
                    done: AsyncValue[None] = AsyncValue()
                    pending = [done]
                    host.enqueue(_call_into, op.fn, done)
                    await done
                    pending = []
                else:
                    for r, resume in self._handoffs(run, op):
                        yield r
                        if resume:
                            await self._resume_async(run)
        finally:
            ops.close()
            run.finish(pending)

    async def _resume_async(self, run: _Run) -> None:
        if not self._gate.unpark(run.lease):
            await _await_for(self._gate, run.lease)
            run.restart()

    async def run_async(
        self,
        feeds: Mapping[str, Any],
        call: CallContext | None = None,
        outputs: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        if call is not None:
            call.check()
        it = self.run_batches_async([feeds], window=1)
        try:
            results = await it.__anext__()
        finally:
            await it.aclose()
        return results if outputs is None else fill_outputs(results, outputs)

    def run_call(
        self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None, call: CallContext
    ) -> dict[str, np.ndarray]:
        """``run`` with ``call`` current on this thread: stages computed here check it
        between kernels (reads already under way finish first)."""
        prev = set_current(call)
        try:
            return self.run(feeds, outputs)
        finally:
            set_current(prev)

    # -- one stage, one window ----------------------------------------------------------------
    def feed_env(self, feeds: Mapping[str, Any]) -> dict[int, Any]:
        args = self._check(feeds)
        return {id(v): a for v, a in zip(self._inputs, args)}

    def run_stage(
        self, st: Stage, weights: list[np.ndarray], envs: list[dict[int, Any]], stats: StreamStats
    ) -> None:
        """Run stage ``st`` for every batch env of a window; outputs that view the arena are
        copied out (the arena is overwritten after the stage), dead values dropped. A
        row-gather stage reads its rows from the weight file here (``rows.read_rows``)."""
        g = st.gather
        if g is not None:
            for env in envs:
                env[id(g.output)], got = read_rows(g, env[id(g.indices)], self.drop_cache)
                stats.row_bytes += got
                for i in st.drop_after:
                    env.pop(i, None)
            return
        prog = st.program
        assert prog is not None
        buf = self.arena.buf
        for env in envs:
            outs = prog.run([env[id(v)] for v in st.inputs] + weights)
            for v, o in zip(st.outputs, outs):
                if isinstance(o, np.ndarray) and np.may_share_memory(o, buf):
                    o = o.copy()
                env[id(v)] = o
            for i in st.drop_after:
                env.pop(i, None)

    def results(self, env: dict[int, Any]) -> dict[str, np.ndarray]:
        out: dict[str, Any] = {}
        for v, fixed in zip(self._outputs, self._fixed):
            val = v.const if v.const is not None else env[id(v)]
            if fixed and isinstance(val, np.ndarray):
                val = val.copy()
            out[v.name] = user_output(val, v.type)
        return out


class _Run:
    """One pipeline run: the step generator and its transfer schedule. Owns its state (feeds,
    activations, the steps it requested); holds the arena only through its ``lease``. Used
    by the driving thread (or task), except ``_preempt``, which the gate calls from another
    thread while the run is parked."""

    def __init__(self, prog: StreamedProgram, host: HostContext, overlap: bool) -> None:
        self.prog = prog
        self.host = host
        self._overlap = overlap
        self.stats = StreamStats(overlap=overlap)
        self.t0 = time.perf_counter()
        self.scheds: list[Transfers] = []
        self._requested: list[tuple[Stage, AsyncValue[list[np.ndarray]]]] = []
        self._n_req = self._n_done = 0
        self._new_schedule()
        self.lease = Lease(self._preempt)

    def _new_schedule(self) -> None:
        self.sched = Transfers(self.prog.arena, self.host, self._overlap, self.prog.drop_cache)
        self.scheds.append(self.sched)
        self._n_req = self._n_done = 0

    def request(self, stage: Stage) -> None:
        """Schedule the next step's load of ``stage``."""
        av = self.sched.request(self._n_req, stage)
        self._n_req += 1
        self._requested.append((stage, av))

    def weights(self) -> AsyncValue[list[np.ndarray]]:
        """The oldest requested step's weights (the step about to compute)."""
        return self._requested[0][1]

    def computed(self) -> None:
        """The oldest requested step has computed: its region is free."""
        self.sched.computed(self._n_done)
        self._n_done += 1
        self._requested.pop(0)

    def _preempt(self) -> AsyncValue[None]:
        """The gate takes the arena from this parked run: stop its reads."""
        return self.sched.close()

    def restart(self) -> None:
        """After a preemption, with the arena held again: a fresh schedule that requests the
        steps not yet computed again, in order (their weights were lost)."""
        stages = [st for st, _ in self._requested]
        self._requested = []
        self._new_schedule()
        for st in stages:
            self.request(st)

    def steps(self, window: int, chained: bool = False) -> Generator[_Op, Any, None]:
        """The run's operations for its driver. Unchained, the next window is taken from the
        feeds before the last stage computes; chained, after this window's results were
        handed over, its first stage requested ahead (read while the last stage computes:
        a generation's next step, which a run that ends drops)."""
        prog, stats = self.prog, self.stats
        stages = prog.stages
        raw: list[Mapping[str, Any]] = yield _Need(window)
        self.t0 = time.perf_counter()
        if raw:
            self.request(stages[0])
        while raw:
            envs = [prog.feed_env(f) for f in raw]
            stats.batches += len(raw)
            stats.windows += 1
            nxt: list[Mapping[str, Any]] = []
            for s, st in enumerate(stages):
                if s + 1 < len(stages):
                    self.request(stages[s + 1])
                elif chained:
                    self.request(stages[0])
                else:
                    nxt = yield _Need(window)
                    if nxt:
                        self.request(stages[0])
                t = time.perf_counter()
                weights = yield _Wait(self.weights())
                t2 = time.perf_counter()
                stats.wait_s += t2 - t
                yield _Compute(functools.partial(prog.run_stage, st, weights, envs, stats))
                stats.compute_s += time.perf_counter() - t2
                del weights
                self.computed()
                stats.steps += 1
            if chained:
                yield _Emit([prog.results(e) for e in envs], final=False)
                nxt = yield _Need(window)
            else:
                yield _Emit([prog.results(e) for e in envs], final=not nxt)
            raw = nxt

    def finish(self, pending: list[AsyncValue[Any]]) -> AsyncValue[None]:
        """End the run: stop reads, then (off this thread if need be) release the gate once
        no read and no ``pending`` compute is in flight; then the stats are recorded (wall
        time: from the first window to now, including the consumer's time between results).
        A run preempted while parked no longer holds the gate: the preemption releases it."""
        gate = self.prog._gate
        gate.unpark(self.lease)  # no preemption from here on; a chosen one still completes
        drained = self.sched.close()
        st = self.stats
        st.wall_s = time.perf_counter() - self.t0
        done: AsyncValue[None] = AsyncValue()

        def release() -> None:
            for ts in (s.stats for s in self.scheds):
                st.transfer_s += ts.seconds
                st.bytes_read += ts.bytes
                st.reads += ts.reads
            st.bytes_read += st.row_bytes
            st.first_transfer_s = self.scheds[0].stats.first_seconds
            self.prog.last_stats = st
            gate.release(self.lease)
            done.set(None)

        run_when_ready([drained, *pending], release)
        return done


def _wait_for(gate: Gate, lease: Lease) -> None:
    """Block until ``lease`` holds ``gate`` (leaving the queue if interrupted)."""
    grant = gate.acquire(lease)
    try:
        grant.wait()
    except BaseException:
        gate.abandon(lease, grant)
        raise


async def _await_for(gate: Gate, lease: Lease) -> None:
    """Await until ``lease`` holds ``gate`` (leaving the queue if cancelled)."""
    grant = gate.acquire(lease)
    try:
        await grant
    except BaseException:
        gate.abandon(lease, grant)
        raise


async def run_each_async(model: Any, feeds: Any) -> AsyncIterator[dict[str, np.ndarray]]:
    """``Model.run_batches_async`` for a model that does not stream: ``run_async`` per
    batch; ``feeds`` is an iterable or an async iterable."""
    if hasattr(feeds, "__aiter__"):
        async for f in feeds:
            yield await model.run_async(f)
    else:
        for f in feeds:
            yield await model.run_async(f)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def _window(window: int | None) -> int:
    n = DEFAULT_WINDOW if window is None else window
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"window must be a positive number of batches, got {window!r}")
    return n


def _take(it: Iterator[Mapping[str, Any]], n: int) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for feeds in it:
        out.append(_feeds(feeds, out))
        if len(out) == n:
            break
    return out


async def _take_async(it: Any, n: int) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    while len(out) < n:
        try:
            feeds = await it.__anext__()
        except StopAsyncIteration:
            break
        out.append(_feeds(feeds, out))
    return out


def _feeds(feeds: Any, got: list[Any]) -> Mapping[str, Any]:
    if not isinstance(feeds, Mapping):
        raise InputError(
            f"run_batches: each batch must be a mapping of input name -> array; batch "
            f"{len(got)} of this window is a {type(feeds).__name__}"
        )
    return feeds


def _call_into(fn: Callable[[], None], done: AsyncValue[None]) -> None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - reported to the awaiting task
        done.set_error(e)
        return
    done.set(None)
