"""The dataflow executor: kernels run as their inputs become available (TFRT's BEF executor,
TF's executor with pending counts), over a load-time ``Schedule`` (``dataflow_schedule``).

A run owns a small state (``Run``): an environment list copied from the program's
template, one token list per multi-producer consumer, and a result AsyncValue. Running is
Kahn's algorithm: a finished kernel releases its consumers (single-producer ones directly,
others by popping a token; ``list.pop`` is atomic, so no lock on the hot path), and
released kernels are scheduled by kind:

* CHEAP: pushed on the releasing thread's local ready list and run inline -- cheap kernels
  never cross threads;
* EXPENSIVE: a thread keeps at most one to run itself once its cheap work is done (the
  "tail"); another expensive one goes to the host's worker pool. An event-loop thread
  keeps none: it must stay free to run async kernels, so it sends them all to the pool;
* ASYNC: ``async def`` kernels are spawned on the run's event loop (the caller's loop for
  ``run_async``, the host's background loop for ``run``); their completion continues the
  graph on that loop's thread.

Control flow is non-strict (a kernel may start before all its inputs are available): an If
launches once its cond and the captures of the branch it takes are available; a Loop or
Scan launches once its own inputs are, completes without its captures when it runs zero
iterations, and runs its first iteration as a nested dataflow run into which captures
flow as they arrive (``dataflow_schedule``, ``dataflow_control``). Programs without control
flow have no gates and take no control-flow branch in the run loop.

Errors (TFRT semantics): a failed kernel's outputs are errors; a kernel with an error among
its inputs does not run and forwards it. The call raises ``ExecutionError`` naming the
failing node (the first in program order when several fail independently).

Cancellation: ``run.cancel()`` (when the task awaiting ``run_async`` is cancelled) stops
every thread from starting another kernel, cancels spawned async kernels, and abandons the
run; a kernel already running on a worker finishes and is discarded. The model is untouched.

Thread safety: a DataflowExecutor is immutable after construction; any number of runs may
proceed at once on any threads. Tests may set ``TFRT_PY_SCHEDULE_SEED`` (or pass
``schedule_seed``) so each ready list pops in a seeded random order: results must not
depend on scheduling order.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..calls import CallCancelled, CallContext, set_current
from ..concurrency import HostContext, LoopBridge, current_bridge
from ..errors import DeadlineExceeded, ExecutionError
from ..ir import Node
from ..kernels import KernelContext, KernelRegistry
from ..kernels.control.flow import iteration_spec
from .dataflow_control import NonStrictLoop
from .dataflow_run import Run, ready_list_factory
from .dataflow_schedule import (
    ASYNC,
    CHEAP,
    CTRL,
    EXPENSIVE,
    GATE,
    IfGates,
    Schedule,
    build_schedule,
)
from .program import Program, compile_program, named_deadline, node_captures

__all__ = ["SCHEDULE_SEED_ENV", "DataflowExecutor"]

SCHEDULE_SEED_ENV = "TFRT_PY_SCHEDULE_SEED"


class DataflowExecutor:
    """Runs a compiled Program as a dataflow graph on a HostContext.

    ``expensive(node)`` is the cost classification (the cost model's
    ``ModelCost.expensive``: whether a kernel is worth a pool hop); ``schedule_seed``
    (default: the ``TFRT_PY_SCHEDULE_SEED`` environment variable) randomizes the order of
    ready kernels, for tests. Loop/Scan are non-strict only with a ``registry`` (their
    bodies are compiled again, as nested dataflow programs); without one they run as
    strict kernels. ``sources``: slot groups a parent run supplies later (a Loop/Scan
    body's captures; ``dataflow_schedule``). ``loop_budget`` = (``us(node)``, budget µs):
    on an event loop's thread, cheap kernels run inline only until their estimated µs add
    up to the budget; the remaining ready work then goes to the pool, so a long run of
    cheap kernels never holds the loop.
    """

    def __init__(
        self,
        program: Program,
        registry: KernelRegistry | None = None,
        *,
        expensive: Callable[[Node], bool],
        schedule_seed: int | None = None,
        sources: Sequence[Sequence[int]] = (),
        loop_budget: tuple[Callable[[Node], float], float] | None = None,
    ) -> None:
        self.program = program
        self._loop_budget = loop_budget
        self.schedule: Schedule = build_schedule(
            program, expensive, sources=sources, nonstrict=registry is not None
        )
        self.has_async = bool(self.schedule.async_calls)
        if schedule_seed is None and os.environ.get(SCHEDULE_SEED_ENV):
            schedule_seed = int(os.environ[SCHEDULE_SEED_ENV])
        self.schedule_seed = schedule_seed
        self._new_ready = ready_list_factory(schedule_seed)
        #: per ``schedule.ctrls`` entry, its runtime (same order)
        self.ctrls: list[NonStrictLoop] = []
        for gates in self.schedule.ctrls:
            assert registry is not None
            node = program.instrs[gates.node].node
            spec = iteration_spec(KernelContext(node))
            assert spec is not None, node.op_type
            body_prog = compile_program(
                node.attrs["body"], registry, node_captures(node), nested=True
            )
            body = DataflowExecutor(
                body_prog,
                registry,
                expensive=expensive,
                schedule_seed=schedule_seed,
                sources=[[body_prog.capture_slots[q] for q in g] for g in gates.groups],
                loop_budget=loop_budget,
            )
            self.ctrls.append(NonStrictLoop(gates, spec, body, expensive(node)))
        p = self.schedule
        self._kinds = p.kinds
        # One tuple per index, unpacked once per kernel: its call, then the consumers it
        # releases alone -- cheap ones (pushed with one extend) and others -- and its
        # (consumer, token list) pairs.
        self._steps = [
            (
                *call,
                tuple(c for c in s1 if p.kinds[c] == CHEAP),
                tuple(c for c in s1 if p.kinds[c] != CHEAP),
                sn,
            )
            for call, s1, sn in zip(p.calls, p.succ1, p.succn)
        ]
        self._template = program.template
        # On an event loop's thread, cheap kernels run inline until their estimated µs add
        # up to the budget; the rest of the ready work then moves to the pool.
        self._loop_us: list[float] | None = None
        self._budget_us = -1.0
        if loop_budget is not None:
            us_of, self._budget_us = loop_budget
            self._loop_us = [us_of(ins.node) for ins in program.instrs]
            self._loop_us += [0.0] * (len(p.kinds) - len(self._loop_us))
        self._input_slots = program.input_slots
        self._output_slots = program.output_slots
        self._nodes = [ins.node for ins in program.instrs]
        self._counts = (len(p.ifs), len(p.ctrls))

    # -- entry points ---------------------------------------------------------------------------
    def run(
        self, inputs: Sequence[Any], host: HostContext, call: CallContext | None = None
    ) -> list[Any]:
        """Run on the calling thread (no event loop needed), blocking until done. Async
        kernels run on the host's background loop. Returns the outputs in order. Under a
        ``call``, its deadline stops the run (DeadlineExceeded naming the first unfinished
        kernel) and wakes the caller at once."""
        bridge = None
        if self.has_async:
            bridge = host.background_bridge()
            if bridge.in_loop_thread():
                raise RuntimeError(
                    "model.run() was called on the host's event-loop thread (from an async "
                    "kernel?); it would wait on itself -- use 'await model.run_async()'"
                )
        run = self._start(inputs, host, bridge, True, call)
        result = run.result
        if result.is_available():
            return result.value
        try:
            return result.wait()
        except BaseException:
            if not result.is_available():  # interrupted while waiting
                run.cancel()
            raise

    async def run_async(
        self, inputs: Sequence[Any], host: HostContext, call: CallContext | None = None
    ) -> list[Any]:
        """Run from a coroutine on asyncio, uvloop or trio. Cheap kernels run on the loop's
        thread, expensive ones in the pool, async kernels as tasks of this loop. Cancelling
        the awaiting task cancels the run (and, through ``call``, a running Loop/Scan at
        its next iteration)."""
        bridge = None
        if self.has_async:
            bridge = current_bridge()
            if bridge is None:
                raise RuntimeError("run_async needs a running asyncio, uvloop or trio event loop")
        run = self._start(inputs, host, bridge, False, call)
        result = run.result
        if result.is_available():
            return result.value
        try:
            return await result
        except BaseException:
            if not result.is_available():  # the awaiting task was cancelled
                run.cancel()
                if call is not None:
                    call.cancel()
            raise

    def _start(
        self,
        inputs: Sequence[Any],
        host: HostContext,
        bridge: LoopBridge | None,
        inline: bool,
        call: CallContext | None,
    ) -> Run:
        run = self.new_run(inputs, host, bridge, call=call)
        if call is not None:
            call.on_stop(partial(self._stopped, run))
        self.go(run, self.schedule.initial, inline)
        return run

    def _stopped(self, run: Run) -> None:
        """On the thread that stopped ``run.call``: stop every thread of the run and fail
        the call with the stop's error (the caller wakes now, not when a kernel ends)."""
        call = run.call
        assert call is not None
        run.cancel()
        if call.reason == "deadline":
            env = run.env
            unfinished = next(
                (n for n, (_, _, outs, single, *_) in zip(self._nodes, self._steps)
                 if env[outs if single else outs[0]] is None),
                None,
            )  # fmt: skip
            error: BaseException = named_deadline(call.deadline_error(), unfinished) if (
                unfinished is not None) else call.deadline_error()  # fmt: skip
        else:
            error = CallCancelled("the call was cancelled")
        if not run.result.is_available():
            with contextlib.suppress(RuntimeError):  # set concurrently by another thread
                run.result.set_error(error)

    def new_run(
        self,
        inputs: Sequence[Any],
        host: HostContext,
        bridge: LoopBridge | None,
        parent: Run | None = None,
        call: CallContext | None = None,
    ) -> Run:
        """A run's state: the env template with ``inputs`` in the input slots, fresh
        tokens. Nothing runs until ``go``."""
        env = self._template.copy()
        for slot, val in zip(self._input_slots, inputs):
            env[slot] = val
        tokens = list(map(list.copy, self.schedule.tokens))
        return Run(env, tokens, host, bridge, *self._counts, parent, call)

    def go(self, run: Run, initial: Sequence[int], inline: bool) -> None:
        """Start ``run`` from the indices ``initial`` (``schedule.initial``, plus the sources a
        parent has already supplied) on this thread; return when nothing is left here."""
        ready = self._new_ready([])
        tail = -1
        kinds = self._kinds
        try:
            for c in initial:
                if kinds[c] == CHEAP:
                    ready.append(c)
                else:
                    tail = self._special(run, c, ready, tail, inline)
            self._drain(run, ready, inline, tail)
        except BaseException:  # an interrupt inside a kernel: stop the other threads too
            run.cancel()
            raise

    def drain(self, run: Run, indices: list[int], inline: bool) -> None:
        """Continue ``run`` on this thread from ``indices`` whose outputs are written (or
        whose failure is recorded): release their consumers and run what belongs here."""
        self._drain(run, self._new_ready(indices), inline)

    # -- the run loop ---------------------------------------------------------------------------
    def _drain(self, run: Run, ready: list[int], inline: bool, tail: int = -1) -> None:
        """Run ``ready`` and everything it releases that belongs on this thread; return when
        nothing is left here. ``inline``: this thread may run one expensive kernel itself."""
        if run.call is not None:  # Loop/Scan kernels find the call as the thread's current
            prev = set_current(run.call)
            try:
                self._drain_loop(run, ready, inline, tail)
            finally:
                set_current(prev)
        else:
            self._drain_loop(run, ready, inline, tail)

    def _drain_loop(self, run: Run, ready: list[int], inline: bool, tail: int) -> None:
        env = run.env
        tokens = run.tokens
        steps = self._steps
        kinds = self._kinds
        users = self.schedule.users
        loop_us = None if inline or not run.pool_ok else self._loop_us
        spent = 0.0
        while True:
            while ready:
                i = ready.pop()
                if loop_us is not None:
                    spent += loop_us[i]
                    if spent > self._budget_us:  # the loop has been busy long enough
                        ready.append(i)
                        run.host.enqueue(self._pool_resume, run, list(ready))
                        ready.clear()
                        return
                fn, ins, outs, single, cheap, other, multi = steps[i]
                if run.stop and not run.should_run(i, users[i]):
                    if run.cancelled:
                        return
                else:
                    try:
                        r = fn(*[env[s] for s in ins])
                        if single:
                            env[outs] = r
                        else:
                            for o, x in zip(outs, r):
                                env[o] = x
                    except Exception as e:  # noqa: BLE001 - a kernel's failure is its output
                        run.fail(i, e, users[i])
                if cheap:
                    ready.extend(cheap)
                if other:
                    for c in other:
                        tail = self._special(run, c, ready, tail, inline)
                if multi:
                    for c, m in multi:
                        if tokens[m].pop() == 0:
                            if kinds[c] == CHEAP:
                                ready.append(c)
                            else:
                                tail = self._special(run, c, ready, tail, inline)
            if tail < 0:
                return
            ready.append(tail)
            tail = -1

    def _special(self, run: Run, c: int, ready: list[int], tail: int, inline: bool) -> int:
        """Schedule a released non-cheap index; returns the (new) expensive tail."""
        kind = self._kinds[c]
        if kind == EXPENSIVE:
            if not run.pool_ok:
                ready.append(c)
                return tail
            if not inline:
                run.host.enqueue(self._pool_task, run, c)
                return tail
            if tail >= 0:
                run.host.enqueue(self._pool_task, run, tail)
            return c
        if kind == ASYNC:
            self._spawn(run, c, ready)
        elif kind == GATE:
            ready.append(c)  # a no-op that releases END
            owner, role = self.schedule.gate_of[c]
            if isinstance(owner, IfGates):
                j = run.fire_gate(owner, role, c)
                if j >= 0:
                    if self._kinds[j] == CHEAP:
                        ready.append(j)
                    else:
                        return self._special(run, j, ready, tail, inline)
            else:  # a non-strict Loop/Scan
                self.ctrls[owner.ordinal].fire(self, run, role, c, ready, inline)
        else:  # END
            self._finish(run, inline)
        return tail

    def _pool_resume(self, run: Run, indices: list[int]) -> None:
        """On a worker thread: ready work an event loop's thread handed off (its inline
        budget was spent)."""
        try:
            self._drain(run, self._new_ready(indices), True)
        except BaseException as e:  # noqa: BLE001 - the caller must hear of it, not the pool
            run.abort(e)

    def _pool_task(self, run: Run, i: int) -> None:
        """On a worker thread: run expensive kernel ``i`` and what it releases."""
        try:
            self._drain(run, self._new_ready([i]), True)
        except BaseException as e:  # noqa: BLE001 - the caller must hear of it, not the pool
            run.abort(e)

    # -- async kernels --------------------------------------------------------------------------
    def _spawn(self, run: Run, i: int, ready: list[int]) -> None:
        if run.stop and not run.should_run(i, self.schedule.users[i]):
            if not run.cancelled:
                ready.append(i)  # forwards the error without running
            return
        fn, ins, _, _ = self.schedule.async_calls[i]
        env = run.env
        args = [env[s] for s in ins]
        bridge = run.bridge
        assert bridge is not None, "a run with async kernels has a loop bridge"
        handle = bridge.spawn(fn, args, partial(self._async_done, run, i))
        run.cancel_token().add_callback(handle.cancel)

    def _async_done(self, run: Run, i: int, value: Any, error: BaseException | None) -> None:
        """On the loop's thread: store the kernel's outputs and continue the graph here."""
        if run.cancelled:
            return
        try:
            if error is not None:
                run.fail(i, error, self.schedule.users[i])
            else:
                _, _, outs, single = self.schedule.async_calls[i]
                try:
                    if single:
                        run.env[outs] = value
                    else:
                        for o, x in zip(outs, value):
                            run.env[o] = x
                except Exception as e:  # noqa: BLE001 - a bad result is the kernel's failure
                    run.fail(i, e, self.schedule.users[i])
            self._drain(run, self._new_ready([i]), False)
        except BaseException as e:  # noqa: BLE001 - the caller must hear of it, not the loop
            run.abort(e)

    # -- completion --------------------------------------------------------------------------
    def _finish(self, run: Run, inline: bool) -> None:
        """END: every kernel has run or forwarded an error. Set the result (its callbacks
        wake the caller) on this thread; a child run then calls its ``on_done``."""
        token = run.token
        if token is not None:  # all async kernels are done: nothing left to cancel
            run.host.release_token(token)
        self._set_result(run)
        if run.on_done is not None:
            run.on_done(inline)

    def _set_result(self, run: Run) -> None:
        if run.result.is_available():  # stopped by its call (deadline, cancel) meanwhile
            return
        if run.failures:
            i = min(run.failures)
            node, cause = self._nodes[i], run.failures[i]
            if isinstance(cause, CallCancelled):
                run.result.set_error(cause)
            elif isinstance(cause, DeadlineExceeded):
                run.result.set_error(named_deadline(cause, node))
            elif isinstance(cause, ExecutionError) and cause.node_name == node.name:
                run.result.set_error(cause)
            else:
                err = ExecutionError(node.name, node.op_type, cause)
                err.__cause__ = cause
                run.result.set_error(err)
            return
        env = run.env
        run.result.set([env[s] for s in self._output_slots])

    def describe(self) -> str:
        """One line: kernels by kind, non-strict control flow, and the expensive kernels."""
        p = self.schedule
        n = p.n_nodes
        expensive = [self._nodes[i].name for i in range(n) if p.kinds[i] == EXPENSIVE]
        n_async = sum(1 for i in range(n) if p.kinds[i] == ASYNC)
        names = ", ".join(expensive[:4]) + (", ..." if len(expensive) > 4 else "")
        n_ctrl = sum(1 for i in range(n) if p.kinds[i] == CTRL)
        text = (
            f"dataflow: {n - len(expensive) - n_async - n_ctrl} cheap, {len(expensive)} "
            f"expensive, {n_async} async kernels; {len(p.ifs)} non-strict If, "
            f"{n_ctrl} non-strict Loop/Scan"
        )
        return text + (f"; expensive: {names}" if expensive else "")
