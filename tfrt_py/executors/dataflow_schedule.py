"""The dataflow executor's load-time schedule, computed once from a compiled ``Program``.

Everything a run needs except its own counters is decided here (TFRT precomputes user and
ready counts at load; so does TF's executor): per *index* -- the program's nodes, then
sources, then gates, then one END index --

* ``kinds``: CHEAP (run inline on the releasing thread), EXPENSIVE (at most one inline per
  thread, others to the pool), ASYNC (an ``async def`` kernel, awaited on an event loop),
  GATE (control-flow non-strictness, below), CTRL (a non-strict Loop/Scan node: never
  released, completed by ``dataflow_control``), END (the run is complete);
* ``calls``: ``(fn, input slots, output slot(s), single)``, as the Program's instructions
  (a no-op for ASYNC/GATE/CTRL indices: their work happens elsewhere, the loop only
  propagates);
* ``succ1``: consumers whose only producer is this index (released without a counter);
  ``succn``: ``(consumer, counter)`` pairs for consumers with several producers; a run copies
  ``tokens`` (one ``list(range(k))`` per counter) and whoever pops token 0 releases it;
* ``users``: every consumer, for forwarding errors.

END's producers are the sinks (indices without consumers) and every gate, so a run
completes only when every node has run or forwarded an error -- as the sync interpreter,
every kernel runs, and a failure anywhere fails the call.

Sources (nested body runs only, ``sources=``): groups of slots (a Loop/Scan body's
captures) that the enclosing run supplies after the body run starts. Each group is one
CHEAP no-op index that is not ready at start; ``dataflow_control`` writes the slots and
releases it when the outer producer finishes.

Control flow is non-strict (TFRT: a non-strict kernel may start before all its inputs are
available):

* If gets three gates -- cond, then-captures, else-captures -- each released by its own
  producers; the If launches once the cond gate has fired and the gate of the branch
  ``cond`` picks has too, so it never waits for values only the other branch reads.
* Loop and Scan-9+ whose body captures a value some node of this program produces (with
  ``nonstrict=True``; else they are plain strict kernels) get a *control gate* -- the
  producers of their own ONNX inputs (Loop: M, cond, initial carried; Scan: initial states,
  scan inputs) -- and one *capture gate* per producer of captured values. The node itself
  (CTRL) is launched by its control gate, without waiting for any capture gate; what it
  then does is ``dataflow_control``'s.

A program without control flow has no gates, sources or CTRL nodes: nothing in its run
loop knows control flow exists (TF's SimplePropagatorState).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..ir import Node
from .program import Instr, Program, node_captures

__all__ = [
    "ASYNC",
    "CHEAP",
    "CTRL",
    "END",
    "EXPENSIVE",
    "GATE",
    "CtrlGates",
    "IfGates",
    "Schedule",
    "build_schedule",
]

CHEAP, EXPENSIVE, ASYNC, GATE, END, CTRL = range(6)
_RESERVED_SLOTS = 2  # slot 0 reads None (omitted input), slot 1 swallows omitted outputs


def _noop() -> tuple[()]:
    return ()


_NOOP_CALL = (_noop, (), (), False)


class IfGates:
    """One non-strict If: its node index, cond slot, gate indices (cond, then, else) and
    ``ordinal``, its position in ``Schedule.ifs`` (and in a run's If-state list)."""

    __slots__ = ("cond_slot", "gates", "node", "ordinal")

    def __init__(
        self, node: int, cond_slot: int, gates: tuple[int, int, int], ordinal: int
    ) -> None:
        self.node = node
        self.cond_slot = cond_slot
        self.gates = gates
        self.ordinal = ordinal


class CtrlGates:
    """One non-strict Loop or Scan: its node index, ``ordinal`` (its position in
    ``Schedule.ctrls`` and in a run's state list), ``control`` (the control gate's index),
    ``groups`` (per capture gate, in gate order: the positions, in ``node_captures``
    order, of the captured values its producer makes), ``input_slots`` (the node's ONNX
    inputs), ``capture_slots`` (its captured values, in ``node_captures`` order) and the
    output slot(s) ``outs`` (``single``: one int)."""

    __slots__ = (
        "capture_slots",
        "control",
        "gate_index",
        "groups",
        "input_slots",
        "node",
        "ordinal",
        "outs",
        "single",
    )

    def __init__(
        self,
        node: int,
        ordinal: int,
        control: int,
        groups: tuple[tuple[int, ...], ...],
        input_slots: tuple[int, ...],
        capture_slots: tuple[int, ...],
        outs: Any,
        single: bool,
    ) -> None:
        self.node = node
        self.ordinal = ordinal
        self.control = control
        #: capture gate index -> group number
        self.gate_index = {control + 1 + k: k for k in range(len(groups))}
        self.groups = groups
        self.input_slots = input_slots
        self.capture_slots = capture_slots
        self.outs = outs
        self.single = single


class Schedule:
    """The immutable per-program tables described in the module docstring."""

    def __init__(self, n_nodes: int) -> None:
        self.n_nodes = n_nodes
        self.kinds: list[int] = []
        self.calls: list[tuple[Any, Any, Any, bool]] = []
        self.succ1: list[tuple[int, ...]] = []
        self.succn: list[tuple[tuple[int, int], ...]] = []
        self.users: list[tuple[int, ...]] = []
        self.tokens: list[list[int]] = []
        self.initial: list[int] = []
        #: ASYNC node index -> (coroutine function, input slots, output slots, single).
        self.async_calls: dict[int, tuple[Any, tuple[int, ...], Any, bool]] = {}
        #: GATE index -> (IfGates, role): role 0 cond, 1 then, 2 else; or (CtrlGates, role):
        #: role 0 control, 1 + k capture group k.
        self.gate_of: dict[int, tuple[IfGates | CtrlGates, int]] = {}
        self.ifs: list[IfGates] = []
        self.ctrls: list[CtrlGates] = []
        #: source indices, one per ``sources`` group, in order
        self.sources: list[int] = []
        self.end = -1


def build_schedule(
    program: Program,
    expensive: Callable[[Node], bool],
    *,
    sources: Sequence[Sequence[int]] = (),
    nonstrict: bool = False,
) -> Schedule:
    """The schedule for ``program``; ``expensive(node)`` classifies the non-async kernels.
    ``sources``: slot groups supplied later (see the module docstring); ``nonstrict``: give
    Loop/Scan-9+ nodes with produced captures gates (the executor can run their bodies)."""
    instrs = program.instrs
    n = len(instrs)
    schedule = Schedule(n)
    producer: dict[int, int] = {}
    for i, ins in enumerate(instrs):
        for s in ins.outs:
            if s >= _RESERVED_SLOTS:
                producer[s] = i
    for k, group in enumerate(sources):
        for s in group:
            producer[s] = n + k

    def producers(slots: Any) -> list[int]:
        return sorted({producer[s] for s in slots if s in producer})

    ctrl = [nonstrict and _is_nonstrict_loop(ins, producer) for ins in instrs]
    deps = _add_nodes(schedule, instrs, ctrl, expensive, producers)
    for _ in sources:  # released by dataflow_control, never at start
        schedule.sources.append(len(deps))
        schedule.kinds.append(CHEAP)
        schedule.calls.append(_NOOP_CALL)
        deps.append([])
    for i, ins in enumerate(instrs):  # gates go after the nodes and sources
        if _is_if(ins.node):
            schedule.ifs.append(_add_if_gates(schedule, i, ins.node, ins.ins, producers, deps))
        elif ctrl[i]:
            schedule.ctrls.append(_add_ctrl_gates(schedule, i, ins, producer, producers, deps))
    _add_end_and_links(schedule, deps)
    # Ready at start: no producers (If and CTRL nodes are launched by their gates, sources
    # by the enclosing run, never directly). Reversed, so the run loop (which pops from the
    # end) starts with the first node.
    late = set(schedule.sources)
    late.update(i for i in range(n) if ctrl[i] or _is_if(instrs[i].node))
    schedule.initial = [i for i, ds in enumerate(deps) if not ds and i not in late][::-1]
    return schedule


def _add_nodes(
    schedule: Schedule,
    instrs: list[Instr],
    ctrl: list[bool],
    expensive: Callable[[Node], bool],
    producers: Callable[[Any], list[int]],
) -> list[list[int]]:
    """One entry per instruction (its kind and call); returns each one's producers (none
    for If and CTRL nodes: their gates wait instead)."""
    deps: list[list[int]] = []
    for i, ins in enumerate(instrs):
        if ins.flags.is_async:
            schedule.kinds.append(ASYNC)
            schedule.calls.append(_NOOP_CALL)
            outs = ins.outs[0] if ins.single else ins.outs
            schedule.async_calls[i] = (ins.fn, ins.ins, outs, ins.single)
        elif ctrl[i]:
            schedule.kinds.append(CTRL)
            schedule.calls.append(_NOOP_CALL)
        else:
            schedule.kinds.append(EXPENSIVE if expensive(ins.node) else CHEAP)
            schedule.calls.append(
                (ins.fn, ins.ins, ins.outs[0] if ins.single else ins.outs, ins.single)
            )
        deps.append([] if _is_if(ins.node) or ctrl[i] else producers(ins.ins))
    return deps


def _add_end_and_links(schedule: Schedule, deps: list[list[int]]) -> None:
    """The END entry, waiting on every entry nothing waits on (appended to ``deps``), and
    the successor tables ``users``, ``succ1``, ``succn`` and ``tokens`` from ``deps``."""
    users: list[list[int]] = [[] for _ in deps]
    for c, ds in enumerate(deps):
        for p in ds:
            users[p].append(c)
    sinks = [i for i in range(len(deps)) if not users[i]]  # every gate is one: nothing lists it
    schedule.end = len(deps)
    schedule.kinds.append(END)
    schedule.calls.append(_NOOP_CALL)
    deps.append(sinks)
    users.append([])
    for p in sinks:
        users[p].append(schedule.end)

    succ1: list[list[int]] = [[] for _ in deps]
    succn: list[list[tuple[int, int]]] = [[] for _ in deps]
    for c, ds in enumerate(deps):
        if len(ds) == 1:
            succ1[ds[0]].append(c)
        elif len(ds) > 1:
            m = len(schedule.tokens)
            schedule.tokens.append(list(range(len(ds))))
            for p in ds:
                succn[p].append((c, m))
    schedule.succ1 = [tuple(s) for s in succ1]
    schedule.succn = [tuple(s) for s in succn]
    schedule.users = [tuple(u) for u in users]


def _is_nonstrict_loop(ins: Instr, producer: dict[int, int]) -> bool:
    """A Loop or Scan-9+ (our control-flow kernel, not a custom one) whose body captures a
    value some index of this program produces: non-strictness can only help those."""
    node = ins.node
    if not ins.flags.control_flow or node.domain not in ("", "ai.onnx"):
        return False
    if not (node.op_type == "Loop" or (node.op_type == "Scan" and node.opset >= 9)):
        return False
    return any(s in producer for s in ins.ins[len(node.inputs) :])


def _is_if(node: Node) -> bool:
    return node.op_type == "If" and node.domain == ""


def _add_if_gates(
    schedule: Schedule,
    i: int,
    node: Node,
    in_slots: tuple[int, ...],
    producers: Callable[[Any], list[int]],
    deps: list[list[int]],
) -> IfGates:
    # The kernel's trailing arguments are node_captures(node), in that order.
    capture_slot = {
        id(v): s for v, s in zip(node_captures(node), in_slots[len(node.inputs) :], strict=True)
    }
    branch_slots = []
    for attr in ("then_branch", "else_branch"):
        graph = node.attrs[attr]
        branch_slots.append([capture_slot[id(v)] for v in graph.free_values()])
    gate_deps = [producers(in_slots[:1]), producers(branch_slots[0]), producers(branch_slots[1])]
    first = len(deps)
    gates = IfGates(i, in_slots[0], (first, first + 1, first + 2), len(schedule.ifs))
    _append_gates(schedule, gates, gate_deps, deps)
    return gates


def _append_gates(
    schedule: Schedule, gates: Any, gate_deps: list[list[int]], deps: list[list[int]]
) -> None:
    """One GATE entry per role of ``gates`` (indices from ``len(deps)`` on), each waiting
    on its list of ``gate_deps``."""
    first = len(deps)
    for role, ds in enumerate(gate_deps):
        schedule.kinds.append(GATE)
        schedule.calls.append(_NOOP_CALL)
        schedule.gate_of[first + role] = (gates, role)
        deps.append(ds)


def _add_ctrl_gates(
    schedule: Schedule,
    i: int,
    ins: Instr,
    producer: dict[int, int],
    producers: Callable[[Any], list[int]],
    deps: list[list[int]],
) -> CtrlGates:
    n_in = len(ins.node.inputs)
    capture_slots = ins.ins[n_in:]  # node_captures(node) order
    by_producer: dict[int, list[int]] = {}
    for pos, s in enumerate(capture_slots):
        if s in producer:
            by_producer.setdefault(producer[s], []).append(pos)
    first = len(deps)
    gates = CtrlGates(
        i,
        len(schedule.ctrls),
        first,
        tuple(tuple(by_producer[p]) for p in sorted(by_producer)),
        ins.ins[:n_in],
        capture_slots,
        ins.outs[0] if ins.single else ins.outs,
        ins.single,
    )
    gate_deps = [producers(ins.ins[:n_in]), *([p] for p in sorted(by_producer))]
    _append_gates(schedule, gates, gate_deps, deps)
    return gates
