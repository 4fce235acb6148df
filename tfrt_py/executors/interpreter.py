"""The sync interpreter: a planned, generated, allocation-free program per input signature.

The first call with a new signature (shapes and dtypes of the feeds) runs the prepared
program plainly, keeping every value (``plan_probe.run_env``): that is the call's answer,
and it shows the planner the real shape and dtype of every value. The planner
(``plan_build``) lays the values out in one arena; the code generator (``plan_codegen``)
writes a straight-line function calling each kernel with ``out=`` its arena view. Later
calls with that signature run the generated function: no futures, no locks, no per-kernel
lookups, no allocation but the outputs handed to the user.

Plans are cached per signature (at most ``max_plans``; the oldest is dropped). ``run`` is
always the newest plan's fast entry, which checks the feeds' signature in line and falls
back to ``_slow`` (full feed validation, plan lookup or creation) on any mismatch. Once
``max_plans`` plans have been made (traffic of more shapes than the cache keeps), a new
signature's plain run makes its plan only when the signature comes back
(``_plan_now``): ever-new lengths would otherwise make a plan per call, each dropped
unused -- planning and generating code cost a BERT ~8 ms against its ~2 ms plain run.

A model with dynamic dims whose shapes the compiler's shape model describes
(``compiler.shape_model``: every planned shape a formula in batch, sequence, past, ...)
gets instead one *generic* plan, made at load from a probe run (``plan_generic``): one
layout and one generated program for every signature, a new signature costing one
evaluation of the formulas (no run of the program, no planning, no code generation);
the first signature of each dim bucket is checked against a plain run first. A generic
plan that fails its check is retired and the model plans per signature from then on.

A program of more than ``MAX_PLANNED_INSTRS`` instructions (a graph of 100k nodes, from a
stranger) is never planned: planning and compiling its code would cost seconds on every
first call, so each call runs it in order, dropping each value after its last reader
(``Program.run_freeing``), linear in the nodes.

A call's deadline covers its planning: a first call whose deadline passed while it ran
raises DeadlineExceeded before it plans.

Threading: ``run`` is safe from many threads at once. Each call takes an arena from its
plan's free list (or makes one), so concurrent calls never share buffers. Plan creation
happens outside any lock except for the cache insert; two threads making the same plan
at once both succeed and one plan is kept. Outputs belong to the caller: fresh arrays, or
the caller's own buffers passed as ``outs``.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import numpy as np

from ..calls import CallCancelled, CallContext, set_current
from ..errors import DeadlineExceeded, ExecutionError, InputError
from ..feeds import check_output_buffers, concat_prefixes
from .base import Executor
from .plan import ALIGN, MemoryPlan
from .plan_build import Layout, build_layout
from .plan_codegen import Generated, generate
from .plan_probe import run_env
from .program import Program, constant_ids, named_deadline, user_output
from .straight import straight_line

if TYPE_CHECKING:
    from .plan_generic import GenericPlan, Instance

__all__ = ["SyncInterpreter"]


class _Plan:
    """One signature's layout, generated code and arena factory. Immutable once made."""

    def __init__(self, program: Program, layout: Layout) -> None:
        self.program = program
        self.layout = layout
        self.line_node: dict[tuple[int, int], int] = {}
        self.gen: Generated | None = None
        size = layout.plan.arena_bytes
        self._views = layout.views
        self._size = size

    def new_arena(self) -> tuple[Any, ...]:
        """One view of a new arena per planned value. Values laid out alike (a kernel
        written in place over its input: same offset, shape and dtype) get one view
        object, so a kernel sees ``out is x`` and needs no address test (~3 µs)."""
        raw = np.empty(self._size + ALIGN, np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        base = raw[start : start + self._size]
        made: dict[tuple[Any, ...], np.ndarray] = {}
        views = []
        for _, off, shape, dt in self._views:
            key = (off, shape, dt)
            v = made.get(key)
            if v is None:
                n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                v = made[key] = base[off : off + n].view(dt).reshape(shape)
            views.append(v)
        return tuple(views)

    def failed(self, e: BaseException, where: str) -> BaseException:
        """The exception to raise for ``e`` escaping the generated code: an
        ExecutionError naming the node whose line failed."""
        if not isinstance(e, Exception) or isinstance(e, CallCancelled):
            return e
        tb = e.__traceback__
        idx = None
        while tb is not None and idx is None:
            idx = self.line_node.get((id(tb.tb_frame.f_code), tb.tb_lineno))
            tb = tb.tb_next
        if idx is None:
            return e
        node = self.program.instrs[idx].node
        if isinstance(e, DeadlineExceeded):
            return named_deadline(e, node)
        if isinstance(e, ExecutionError) and e.node_name == node.name:
            return e
        err = ExecutionError(node.name, node.op_type, e)
        err.__cause__ = e
        return err


#: Programs with more instructions than this run unplanned (see the module docstring).
MAX_PLANNED_INSTRS = 20_000
_UNMADE = object()  # ``SyncInterpreter._straight`` before its first use
#: New signatures remembered, once the plan cache has churned, so that a second sight plans.
SEEN_ONCE_MAX = 256
#: A plan's cost per instruction, roughly (planning and generating its code: ~8 ms for
#: MobileNetV2's 55 instructions, ~20 ms for a GPT-2 decoder's; 2-core Zen 4).
PLAN_S_PER_INSTR = 150e-6


class SyncInterpreter(Executor):
    """Executor "sync": runs one prepared top-level Program with per-signature memory plans.

    ``determined``: ids of values whose shape the input signature fixes (from the
    compiler); only those are planned. ``computed_once``: ids of values whose data it
    fixes (shape arithmetic): a plan computes them once, in its probe run, and keeps them.
    ``check`` validates feeds (a FeedChecker).
    """

    name = "sync"
    writes_concat_in_place = True  # (its Concat kernel's ``out=``: only the new rows)

    def __init__(
        self,
        program: Program,
        determined: set[int],
        check: Any,
        *,
        computed_once: AbstractSet[int] = frozenset(),
        max_plans: int = 8,
        shape_fit: Any = None,
        per_signature: bool = True,
    ) -> None:
        graph = program.graph
        self._program = program
        self._determined = determined
        self._computed_once = computed_once
        self._check = check
        self._max_plans = max_plans
        #: False: plans per signature only for a program whose calls cost more than its
        #: plans would (``_plans_pay``: a cold start's stand-in without a generic plan,
        #: where a plan must pay back before the switch; a decoder's step costs ~2.5 ms
        #: unplanned and its plan ~20 ms, a CNN's call tens of ms and its plan a few);
        #: other calls run freeing values as they go
        self.per_signature = per_signature
        self._unplanned_s = float("inf")  # the cheapest unplanned call's time
        self._unplanned_n = 0
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._plans_made = 0
        #: signatures run plainly once and not planned (``_plan_now``), oldest first
        self._seen_once: dict[tuple[Any, ...], None] = {}
        self._lock = threading.Lock()
        self._in_names = [v.name for v in graph.inputs]
        self._out_names = [v.name for v in graph.outputs]
        self._out_types = [v.type for v in graph.outputs]
        self._prefixes = concat_prefixes(graph)  # outputs whose buffer may hold their feed
        fixed = set(program.input_slots) | {
            s for s, t in enumerate(program.template) if t is not None and s > 1
        }
        seen: set[int] = set()
        self._plain_kinds = []
        for s in program.output_slots:
            self._plain_kinds.append("copy" if s in fixed or s in seen else "user")
            seen.add(s)
        #: the ids of the program's constants (the template keeps them alive)
        self._const_set = frozenset(id(t) for t in program.template[2:] if t is not None)
        self._const_ids = constant_ids(graph)
        self._pure = all(i.flags.pure and not i.flags.is_async for i in program.instrs)
        #: the straight-line code of unplanned calls (``_unplanned``), made on first use
        self._straight: Any = _UNMADE
        #: The entry point: the newest plan's fast path, or the slow path before any plan.
        self.run: Any = self._slow
        #: the generic plan and its generated code (None: plans per signature), and why not
        self._generic: GenericPlan | None = None
        self._generic_gen: Generated | None = None
        self._generic_plan: _Plan | None = None
        self.generic_note = "" if shape_fit is None else shape_fit.reason
        #: too long to plan: every call runs the program, freeing values as it goes
        self.unplanned = len(program.instrs) > MAX_PLANNED_INSTRS
        if self.unplanned:
            self.generic_note = ""
        elif shape_fit is not None and shape_fit.model is not None:
            self._make_generic(shape_fit)

    # -- the slow path -------------------------------------------------------------------
    def run_call(
        self, feeds: Mapping[str, Any], outs: Mapping[str, Any] | None, call: CallContext
    ) -> Any:
        """``run`` under ``call``: its deadline or cancellation stops the call between
        kernels (and Loop/Scan iterations) with DeadlineExceeded / CallCancelled."""
        return self._slow(feeds, outs, call)

    def _slow(
        self,
        feeds: Mapping[str, Any],
        outs: Mapping[str, Any] | None = None,
        call: CallContext | None = None,
    ) -> Any:
        args = self._check(feeds)
        bufs = (
            [None] * len(self._out_names)
            if outs is None
            else check_output_buffers(outs, self._out_names, args, self._prefixes)
        )
        sig = _signature(args)
        if sig is None:  # a map or sequence input: no plan holds it
            vals = self._unplanned(args, call)
            return self._finish_env(vals, self._plain_kinds, args, bufs, outputs_only=True)
        generic = self._generic
        if generic is not None:
            inst = generic.instance(args)
            if inst is not None and inst.bucket in generic.verified:
                generic.publish(inst)
                return self._run_instance(inst, args, bufs, call)
            # the first signature of its bucket (or one the formulas do not cover): a
            # plain run answers, and checks the formulas (every shape; values only where
            # the formulas give one, so the run holds only its live activations)
            env = self._verifying_env(args, call, generic.checked_values)
            if inst is not None:
                why = generic.verify(inst, env)
                if why:
                    self._retire(why)
                else:
                    generic.publish(inst)
            kinds = ["user" if k == "fresh" else k for k in generic.layout.output_kinds]
            return self._finish_env(env, kinds, args, bufs)
        plan = self._plans.get(sig)
        if plan is None and (self.unplanned or not self._plan_now(sig)):
            # no plan for this call: run freeing values as they go (a probe keeping every
            # value costs far more on big activations: fresh pages for all of them)
            t0 = time.perf_counter()
            vals = self._unplanned(args, call)
            self._unplanned_s = min(self._unplanned_s, time.perf_counter() - t0)
            self._unplanned_n += 1
            return self._finish_env(vals, self._plain_kinds, args, bufs, outputs_only=True)
        if plan is None:
            env = self._plain_env(args, call)  # this call's answer, and the probe
            # The layout's alias analysis says which outputs may be feeds, constants or
            # views of them; its "fresh" outputs were made here without ``out=``.
            made = self._make_plan(sig, env, call).layout.output_kinds
            kinds = ["user" if k == "fresh" else k for k in made]
            return self._finish_env(env, kinds, args, bufs)
        assert plan.gen is not None
        layout = plan.layout
        for k, buf in enumerate(bufs):
            s = self._program.output_slots[k]
            if buf is not None and layout.output_kinds[k] == "fresh":
                shape, dtype = layout.shapes[s]
                _check_buffer(self._out_names[k], buf, shape, dtype)
        if call is None:
            vals = plan.gen.run_checked(args, bufs)
        else:
            vals = plan.gen.run_call(args, bufs, call)
        return self._finish(vals, layout.output_kinds, bufs)

    def _unplanned(self, args: Sequence[Any], call: CallContext | None) -> list[Any]:
        """The outputs of a call no plan serves: the program's straight-line code
        (``straight.py``) where it has one and the call has no context to check, else
        ``run_freeing`` under ``call`` (which also names a failing node: the straight
        code's failure runs it again, the kernels being pure)."""
        straight = self._straight
        if straight is _UNMADE:
            straight = self._straight = straight_line(self._program) if self._pure else None
        if straight is not None and call is None:
            try:
                return straight(args)
            except Exception:  # noqa: BLE001 - rerun below to raise it named
                pass
        prev = set_current(call)
        try:
            return self._program.run_freeing(args)
        finally:
            set_current(prev)

    def _verifying_env(
        self, args: Sequence[Any], call: CallContext | None, values: frozenset[int]
    ) -> list[Any]:
        """Run the program on ``args`` under ``call``, keeping every value's shape and the
        values of ``values`` (and of the inputs, constants and outputs)."""
        prev = set_current(call)
        try:
            return self._program.run_shapes(args, values)
        finally:
            set_current(prev)

    def _plain_env(self, args: Sequence[Any], call: CallContext | None) -> list[Any]:
        """Run the program on ``args`` keeping every value, under ``call``."""
        prev = set_current(call)
        try:
            return run_env(self._program, args)
        finally:
            set_current(prev)

    def _finish_env(
        self,
        env: list[Any],
        kinds: Sequence[str],
        args: Sequence[Any],
        bufs: Sequence[Any],
        outputs_only: bool = False,
    ) -> Any:
        """The outputs of a plain run (``env``: its environment, or with ``outputs_only``
        the outputs in order): ``kinds`` (the layout's), and a copy of any output that is
        a feed, a constant or an earlier output."""
        vals = list(env) if outputs_only else [env[s] for s in self._program.output_slots]
        taken = set(map(id, args))
        consts = self._const_set
        own = []
        for v, kind in zip(vals, kinds):
            i = id(v)
            own.append("copy" if i in taken or i in consts else kind)
            taken.add(i)
        return self._finish(vals, own, bufs)

    def _run_instance(
        self, inst: Instance, args: Sequence[Any], bufs: Sequence[Any], call: CallContext | None
    ) -> Any:
        """A call on the generic plan's code for ``inst`` (validated feeds)."""
        gen = self._generic_gen
        assert gen is not None and self._generic is not None
        layout = self._generic.layout
        fresh = dict(zip(sorted(s for s, k in layout.kind.items() if k == "fresh"),
                         inst.consts[len(inst.consts) - layout.plan.n_fresh :]))  # fmt: skip
        for k, buf in enumerate(bufs):
            s = self._program.output_slots[k]
            if buf is not None and layout.output_kinds[k] == "fresh":
                _check_buffer(self._out_names[k], buf, fresh[s], layout.shapes[s][1])
        if call is None:
            vals = gen.run_checked(args, bufs, inst)
        else:
            vals = gen.run_call(args, bufs, call, inst)
        return self._finish(vals, layout.output_kinds, bufs)

    def _make_generic(self, fit: Any) -> None:
        """The generic plan from the shape model's probe run (load time)."""
        env, model = fit.env, fit.model
        sig = _signature([env[s] for s in self._program.input_slots])
        layout = build_layout(
            self._program, env, self._determined, sig or (), self._computed_once, model
        )
        from .plan_generic import GenericPlan  # here: only models with dynamic dims use it

        generic = GenericPlan(self._program, layout, model)
        plan = _Plan(self._program, layout)
        helpers = {"_slow": self._slow, "_failed": plan.failed, "_cp": self._copy,
                   "_uo": self._user, "_adopt": generic.adopt}  # fmt: skip
        gen = generate(self._program, layout, self._in_names, self._out_names, helpers,
                       generic.new_arena, env, generic=generic)  # fmt: skip
        plan.gen = gen
        plan.line_node = gen.line_node
        self._generic, self._generic_gen, self._generic_plan = generic, gen, plan
        self.run = gen.run

    def _retire(self, why: str) -> None:
        """The generic plan's formulas failed a check: plan per signature from now on."""
        self.generic_note = f"retired at a call: {why}"
        self._generic = None
        self.run = self._slow

    def _finish(self, vals: Sequence[Any], kinds: Sequence[str], bufs: Sequence[Any]) -> Any:
        out: dict[str, Any] = {}
        for k, (name, v, kind, buf) in enumerate(zip(self._out_names, vals, kinds, bufs)):
            if buf is not None:
                if v is not buf:
                    arr = np.asarray(v)
                    _check_buffer(name, buf, arr.shape, arr.dtype)
                    np.copyto(buf, arr)
                out[name] = buf
            elif kind == "fresh":
                out[name] = v
            elif kind == "copy":
                out[name] = self._copy(v, k)
            else:
                out[name] = user_output(v, self._out_types[k], self._const_ids)
        return out

    def _copy(self, v: Any, k: int) -> Any:
        if type(v) is np.ndarray:
            return v.copy()
        return user_output(np.array(v) if isinstance(v, np.generic) else v, self._out_types[k])

    def _user(self, v: Any, k: int) -> Any:
        return user_output(v, self._out_types[k], self._const_ids)

    # -- plans ---------------------------------------------------------------------------
    def _plans_pay(self) -> bool:
        """Whether plans per signature are made (see ``per_signature``): always, or once
        two unplanned calls were seen and the cheapest cost more than a plan's estimate
        (a first call's one-time costs do not count)."""
        return self.per_signature or (
            self._unplanned_n >= 2
            and self._unplanned_s > PLAN_S_PER_INSTR * len(self._program.instrs)
        )

    def _plan_now(self, sig: tuple[Any, ...]) -> bool:
        """Whether ``sig``'s call should probe and make its plan (else it runs freeing
        values): always until ``max_plans`` plans were made; after that -- and from the
        start on a cold start's stand-in (not ``per_signature``), which lives seconds and
        whose plan pays only for a signature that comes back -- only for a signature seen
        before (kept for the last ``SEEN_ONCE_MAX`` new ones) and once plans pay
        (``_plans_pay``)."""
        if self.per_signature and self._plans_made < self._max_plans:
            return True
        with self._lock:
            if sig in self._seen_once:
                if not self._plans_pay():
                    return False
                del self._seen_once[sig]
                return True
            self._seen_once[sig] = None
            if len(self._seen_once) > SEEN_ONCE_MAX:
                for old in list(self._seen_once)[: SEEN_ONCE_MAX // 2]:
                    del self._seen_once[old]
        return False

    def _make_plan(
        self, sig: tuple[Any, ...], env: list[Any], call: CallContext | None = None
    ) -> _Plan:
        """The plan for ``sig`` from a plain run's ``env``; ``call``'s deadline or
        cancellation is checked before, between and after the planning phases (a plan
        stopped half-way is dropped, a finished one kept) and raises."""
        if call is not None:
            call.check()
        layout = build_layout(self._program, env, self._determined, sig, self._computed_once)
        if call is not None:
            call.check()
        plan = _Plan(self._program, layout)
        helpers = {
            "_slow": self._slow,
            "_failed": plan.failed,
            "_cp": self._copy,
            "_uo": self._user,
        }
        gen = generate(
            self._program, layout, self._in_names, self._out_names, helpers, plan.new_arena, env
        )
        plan.gen = gen
        plan.line_node = gen.line_node
        with self._lock:
            existing = self._plans.get(sig)
            if existing is not None:
                return existing
            while len(self._plans) >= self._max_plans:
                self._plans.pop(next(iter(self._plans)))
            self._plans[sig] = plan
            self._plans_made += 1
            self.run = gen.run
        if call is not None:
            call.check()
        return plan

    def memory_plan(self, shapes: Mapping[str, Sequence[int]]) -> MemoryPlan:
        """The memory plan for feeds of these shapes (dtypes are the model's), made now
        with a run on zero feeds when no call has made it yet. Models with custom or
        async kernels only report plans made by real calls."""
        feeds = {}
        for spec_name, v in zip(self._in_names, self._program.graph.inputs):
            if spec_name not in shapes:
                raise InputError(f"memory_plan: no shape for input {spec_name!r}")
            dtype = getattr(v.type, "dtype", None)
            if dtype is None:
                raise InputError(f"memory_plan: input {spec_name!r} has no known dtype")
            feeds[spec_name] = np.zeros(tuple(shapes[spec_name]), dtype)
        extra = [k for k in shapes if k not in self._in_names]
        if extra:
            raise InputError(f"memory_plan: unknown input(s) {extra}; inputs are {self._in_names}")
        args = self._check(feeds)
        sig = _signature(args)
        if sig is None:
            raise InputError("memory_plan: the model has non-tensor inputs; nothing is planned")
        if self.unplanned:
            raise ValueError(f"memory_plan: the model has {len(self._program.instrs):,} "
                             f"instructions (more than {MAX_PLANNED_INSTRS:,}); it runs "
                             "unplanned")  # fmt: skip
        generic = self._generic
        if generic is not None:
            inst = generic.instance(args)
            if inst is not None:
                return generic.memory_plan(inst)
        plan = self._plans.get(sig)
        if plan is None:
            if not self._pure:
                raise ValueError(
                    "memory_plan: this model has custom or async kernels, which are not run "
                    "on dummy feeds; call the model once with feeds of these shapes first"
                )
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                env = run_env(self._program, args)
            plan = self._make_plan(sig, env)
        return plan.layout.plan

    def plans(self) -> list[MemoryPlan]:
        """The cached plans, oldest first."""
        return [p.layout.plan for p in list(self._plans.values())]

    def describe_lines(self) -> list[str]:
        how = "straight-line code generated per input signature over a memory plan"
        return [f"  executor: sync ({self.why}; {how})", *self.plan_lines()]

    def plan_lines(self) -> list[str]:
        """``describe()``'s memory lines: the generic plan, or the plans made so far."""
        if self._generic is not None:
            return self._generic.describe_lines()
        if self.unplanned:
            return [f"  memory: not planned: {len(self._program.instrs):,} instructions (more "
                    f"than {MAX_PLANNED_INSTRS:,}); each value is freed after its last "
                    "reader"]  # fmt: skip
        note = [f"  generic plan: not used: {self.generic_note}"] if self.generic_note else []
        if not self._plans_pay():
            return [
                *note,
                "  memory: not planned per signature (a cold start's stand-in whose calls "
                "cost less than their plans would: each value is freed after its last "
                "reader until the switch)",
            ]
        return note + self._signature_plan_lines()

    def _signature_plan_lines(self) -> list[str]:
        plans = self.plans()
        if not plans:
            return ["  memory: planned per input signature on the first call (none yet)"]
        return [
            f"  memory: {len(plans)} plan(s), one per input signature:",
            *(f"    {p.summary()}" for p in plans),
        ]


def _signature(args: Sequence[Any]) -> tuple[Any, ...] | None:
    sig = []
    for a in args:
        if type(a) is not np.ndarray:
            return None
        sig.append((a.shape, a.dtype))
    return tuple(sig)


def _check_buffer(name: str, buf: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
        raise InputError(
            f"outputs[{name!r}]: buffer is {buf.dtype}{list(buf.shape)}, "
            f"the output is {dtype}{list(shape)}"
        )
