"""Non-strict Loop and Scan in the dataflow executor.

TFRT's rule: a *non-strict* kernel may start before all its inputs are available. The schedule
(``dataflow_schedule``) gives every Loop and Scan-9+ whose body captures a value produced in
the same program a control gate (the producers of its own ONNX inputs: Loop ``M``,
``cond`` and initial carried values; Scan initial states and scan inputs) and one capture
gate per producer of captured values. ``NonStrictLoop`` is what happens when they fire:

1. **Launch** when the control gate fires -- never waiting for a capture. A control input
   that is an error makes the node forward it (its outputs become that error).
2. **Zero iterations** (Loop: ``M == 0`` or ``cond`` false; Scan: zero slices): the node
   completes at once (initial carried values / states, empty scan outputs) and never waits
   for its captures. Their producers still run (every kernel runs) and a failure there
   still fails the call naming that node -- as for an If's untaken branch.
3. **Iteration 0** otherwise runs as a nested dataflow run of the body (a child ``Run`` of
   the body's own ``DataflowExecutor``, whose schedule has one *source* per capture gate).
   Captures already available are in its environment at start; each pending one is
   supplied when its producer finishes, on that producer's thread. So body kernels that do
   not depend on a pending capture run at once, the others as their captures arrive.
4. **Later iterations**, once iteration 0 completes (which implies every capture arrived),
   run with the topological interpreter (``Program.run``, as the sync Loop kernel does) on
   the thread that completed iteration 0 -- or on the pool when the node is expensive and
   that thread is an event loop's -- then the outputs are written and consumers released.

Errors: a capture whose producer failed, while the node still needs it (waiting to launch
with iterations to run, or in iteration 0), cancels the child run and makes the node
forward the error; the call names the failing producer. A body kernel failing makes the
node fail with the body's ``ExecutionError``; the call names the Loop/Scan, as the sync
executor does. Cancelling the run cancels the child run (``Run.cancel``).

Threads and ownership: a ``NonStrictLoop`` is immutable (load time). Per call, its
``CtrlState`` is guarded by the run's lock; the iteration state (``LoopState`` /
``ScanState``) belongs to whoever moved the phase to RUNNING, then to whoever moved it to
DONE. The child run's environment gets each capture slot written once, before the source
that releases its readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from threading import get_ident
from typing import Any, Protocol

from ..calls import set_current
from ..kernels.control.flow import LoopSpec, ScanSpec
from .dataflow_run import CtrlState, Run
from .dataflow_schedule import CtrlGates, Schedule
from .program import Program

__all__ = ["NonStrictLoop"]


class DataflowExecutor(Protocol):
    """What a NonStrictLoop uses of the executor that owns it and of its body's
    (``dataflow.DataflowExecutor``, which builds on this module, so it is described here by
    shape, not imported)."""

    schedule: Schedule
    program: Program

    def new_run(
        self, inputs: Sequence[Any], host: Any, bridge: Any, parent: Run | None = None
    ) -> Run: ...

    def go(self, run: Run, initial: Sequence[int], inline: bool) -> None: ...

    def drain(self, run: Run, indices: list[int], inline: bool) -> None: ...


_WAITING, _RUNNING, _DONE = CtrlState.WAITING, CtrlState.RUNNING, CtrlState.DONE


class NonStrictLoop:
    """One non-strict Loop/Scan node of a ``DataflowExecutor`` (see the module docstring).

    ``body`` runs the body program with one source per capture group (``gates.groups``);
    ``expensive``: the node's cost class, for where later iterations run."""

    __slots__ = ("body", "expensive", "feeds", "gates", "spec", "static")

    def __init__(
        self,
        gates: CtrlGates,
        spec: LoopSpec | ScanSpec,
        body: DataflowExecutor,
        expensive: bool,
    ) -> None:
        self.gates = gates
        self.spec = spec
        self.body = body
        self.expensive = expensive
        inner = body.program.capture_slots  # node_captures order, as gates.capture_slots
        outer = gates.capture_slots
        grouped = {p for g in gates.groups for p in g}
        #: (outer slot, body slot) of captures no index produces: available at launch
        self.static = tuple((outer[p], inner[p]) for p in range(len(outer)) if p not in grouped)
        #: per capture group: its (outer slot, body slot) pairs
        self.feeds = tuple(tuple((outer[p], inner[p]) for p in g) for g in gates.groups)

    # -- gates (on the thread that released the gate, inside its drain) -----------------------
    def fire(
        self, ex: DataflowExecutor, run: Run, role: int, g: int, ready: list[int], inline: bool
    ) -> None:
        """Gate ``g`` (role 0: control, 1 + k: capture group k) fired. Completing the node
        appends it to ``ready`` (the caller's ready list)."""
        if role == 0:
            self._launch(ex, run, g, ready, inline)
        else:
            self._capture(run, role - 1, g, ready, inline)

    def _launch(
        self, ex: DataflowExecutor, run: Run, g: int, ready: list[int], inline: bool
    ) -> None:
        i = self.gates.node
        st = run.ctrl[self.gates.ordinal]
        with run.lock:
            if run.poison is not None and g in run.poison:  # an error among the inputs
                st.phase = _DONE
                run._poison((i,))
                bad = True
            else:
                bad = False
        if bad or run.cancelled:
            if bad:
                ready.append(i)
            return
        env = run.env
        spec = self.spec
        state: Any
        try:
            state = spec.begin([env[s] for s in self.gates.input_slots])
            if not spec.more(state):  # zero iterations: the captures are never read
                self._write(env, spec.finish(state))
                state = None
            else:
                inputs = spec.body_inputs(state)
        except Exception as e:  # noqa: BLE001 - a kernel's failure is its output
            run.fail(i, e, ex.schedule.users[i])
            state = None
        if state is None:
            with run.lock:
                st.phase = _DONE
            ready.append(i)
            return
        body = self.body
        child = body.new_run(inputs, run.host, run.bridge, parent=run)
        benv = child.env
        for o, b in self.static:
            benv[b] = env[o]
        child.on_done = partial(self._body_done, ex, run, st, child)
        with run.lock:
            bad = st.bad
            if bad:
                st.phase = _DONE
                run._poison((i,))
            else:
                st.phase = _RUNNING
                st.body = child
                st.state = state
                st.launcher = get_ident()
            arrived = st.arrived
        if bad:
            ready.append(i)
            return
        if run.cancelled:  # cancel() may have run before st.body was set
            child.cancel()
            return
        initial = list(body.schedule.initial)
        for k, pairs in enumerate(self.feeds):
            if arrived >> k & 1:
                for o, b in pairs:
                    benv[b] = env[o]
                initial.append(body.schedule.sources[k])
        try:
            body.go(child, initial, inline)
        finally:
            with run.lock:
                st.launcher = 0
                done_inline, st.done_inline = st.done_inline, False
        if done_inline:  # completed within go(): release here rather than in a nested drain
            ready.append(i)

    def _capture(self, run: Run, k: int, g: int, ready: list[int], inline: bool) -> None:
        st = run.ctrl[self.gates.ordinal]
        with run.lock:
            poisoned = run.poison is not None and g in run.poison
            if poisoned:
                st.bad = True
            else:
                st.arrived |= 1 << k
            child = st.body if st.phase == _RUNNING else None
            if child is not None and poisoned:
                st.phase = _DONE
                st.body = st.state = None
                run._poison((self.gates.node,))
        if child is None:  # not launched yet, or done: the launch reads st
            return
        if poisoned:
            child.cancel()
            ready.append(self.gates.node)
            return
        env, benv = run.env, child.env
        for o, b in self.feeds[k]:
            benv[b] = env[o]
        body = self.body
        body.drain(child, [body.schedule.sources[k]], inline)

    # -- completion ----------------------------------------------------------------------------
    def _body_done(
        self, ex: DataflowExecutor, run: Run, st: CtrlState, child: Run, inline: bool
    ) -> None:
        """On the thread that completed iteration 0: continue the iterations, then release
        the node's consumers."""
        with run.lock:
            if st.phase != _RUNNING or st.body is not child:
                return
            state = st.state
            st.phase = _DONE
            st.body = st.state = None
        if run.cancelled:
            return
        i = self.gates.node
        result = child.result
        if result.is_error():
            run.fail(i, result.error or RuntimeError("body failed"), ex.schedule.users[i])
        else:
            try:
                self.spec.advance(state, result.value)
            except Exception as e:  # noqa: BLE001 - a kernel's failure is its output
                run.fail(i, e, ex.schedule.users[i])
            else:
                if self.expensive and not inline and run.pool_ok and self.spec.more(state):
                    run.host.enqueue(self._rest_task, ex, run, state)
                    return
                self._rest(ex, run, state)
        with run.lock:
            if st.launcher == get_ident():  # inside _launch's go() on this thread
                st.done_inline = True
                return
        ex.drain(run, [i], inline)

    def _rest(self, ex: DataflowExecutor, run: Run, state: Any) -> None:
        """Iterations 1.. with every capture available; write the node's outputs."""
        env = run.env
        prev = set_current(run.call)  # the iterations check the call's deadline/cancel
        try:
            captured = [env[s] for s in self.gates.capture_slots]
            self._write(env, self.spec.run(self.body.program.run, state, captured))
        except Exception as e:  # noqa: BLE001 - a kernel's failure is its output
            i = self.gates.node
            run.fail(i, e, ex.schedule.users[i])
        finally:
            set_current(prev)

    def _rest_task(self, ex: DataflowExecutor, run: Run, state: Any) -> None:
        """On a worker thread: ``_rest``, then release the node's consumers."""
        try:
            if run.cancelled:
                return
            self._rest(ex, run, state)
            ex.drain(run, [self.gates.node], True)
        except BaseException as e:  # noqa: BLE001 - the caller must hear of it, not the pool
            run.abort(e)

    def _write(self, env: list[Any], out: Any) -> None:
        gates = self.gates
        if gates.single:
            env[gates.outs] = out
        else:
            for o, x in zip(gates.outs, out):
                env[o] = x
