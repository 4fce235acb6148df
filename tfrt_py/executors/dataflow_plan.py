"""The dataflow executor's load-time plan, computed once from a compiled ``Program``.

Everything a run needs except its own counters is decided here (TFRT precomputes user and
ready counts at load; so does TF's executor): per *index* -- the program's nodes, then If
gates, then one END index --

* ``kinds``: CHEAP (run inline on the releasing thread), EXPENSIVE (at most one inline per
  thread, others to the pool), ASYNC (an ``async def`` kernel, awaited on an event loop),
  GATE (If non-strictness, below), END (the run is complete);
* ``calls``: ``(fn, input slots, output slot(s), single)``, as the Program's instructions
  (a no-op for ASYNC/GATE indices: their work happens elsewhere, the loop only propagates);
* ``succ1``: consumers whose only producer is this index (released without a counter);
  ``succn``: ``(consumer, counter)`` pairs for consumers with several producers; a run copies
  ``tokens`` (one ``list(range(k))`` per counter) and whoever pops token 0 releases it;
* ``users``: every consumer, for forwarding errors.

END's producers are the sinks (indices without consumers) and every gate, so a run
completes only when every node has run or forwarded an error -- as the sync interpreter,
every kernel runs, and a failure anywhere fails the call.

Control flow: an If node does not wait for all its inputs (it is non-strict). It gets three
gates -- cond, then-captures, else-captures -- each released by its own producers; the If
launches once the cond gate has fired and the gate of the branch ``cond`` picks has too,
so it never waits for values only the other branch reads. Loop and Scan wait for all their
inputs (their bodies may read every capture on the first iteration); all three run their
nested graphs with the existing Program, inside the kernel. A program without If has no
gates: nothing in its run loop knows control flow exists (TF's SimplePropagatorState).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir import Node
from .program import Program, node_captures

__all__ = ["ASYNC", "CHEAP", "END", "EXPENSIVE", "GATE", "IfGates", "Plan", "build_plan"]

CHEAP, EXPENSIVE, ASYNC, GATE, END = range(5)
_RESERVED_SLOTS = 2  # slot 0 reads None (omitted input), slot 1 swallows omitted outputs


def _noop() -> tuple[()]:
    return ()


_NOOP_CALL = (_noop, (), (), False)


class IfGates:
    """One non-strict If: its node index, cond slot, gate indices (cond, then, else) and
    ``ordinal``, its position in ``Plan.ifs`` (and in a run's If-state list)."""

    __slots__ = ("cond_slot", "gates", "node", "ordinal")

    def __init__(
        self, node: int, cond_slot: int, gates: tuple[int, int, int], ordinal: int
    ) -> None:
        self.node = node
        self.cond_slot = cond_slot
        self.gates = gates
        self.ordinal = ordinal


class Plan:
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
        #: GATE index -> (IfGates, role): role 0 cond, 1 then, 2 else.
        self.gate_of: dict[int, tuple[IfGates, int]] = {}
        self.ifs: list[IfGates] = []
        self.end = -1


def build_plan(program: Program, expensive: Callable[[Node], bool]) -> Plan:
    """The plan for ``program``; ``expensive(node)`` classifies the non-async kernels."""
    instrs = program.instrs
    n = len(instrs)
    plan = Plan(n)
    producer: dict[int, int] = {}
    for i, ins in enumerate(instrs):
        for s in ins.outs:
            if s >= _RESERVED_SLOTS:
                producer[s] = i

    def producers(slots: Any) -> list[int]:
        return sorted({producer[s] for s in slots if s in producer})

    deps: list[list[int]] = []
    for i, ins in enumerate(instrs):
        if ins.flags.is_async:
            plan.kinds.append(ASYNC)
            plan.calls.append(_NOOP_CALL)
            outs = ins.outs[0] if ins.single else ins.outs
            plan.async_calls[i] = (ins.fn, ins.ins, outs, ins.single)
        else:
            plan.kinds.append(EXPENSIVE if expensive(ins.node) else CHEAP)
            plan.calls.append(
                (ins.fn, ins.ins, ins.outs[0] if ins.single else ins.outs, ins.single)
            )
        deps.append([] if _is_if(ins.node) else producers(ins.ins))

    for i, ins in enumerate(instrs):  # gates go after the nodes
        if _is_if(ins.node):
            plan.ifs.append(_add_if_gates(plan, i, ins.node, ins.ins, producers, deps))
    users: list[list[int]] = [[] for _ in deps]
    for c, ds in enumerate(deps):
        for p in ds:
            users[p].append(c)
    sinks = [i for i in range(len(deps)) if not users[i]]  # every gate is one: nothing lists it
    plan.end = len(deps)
    plan.kinds.append(END)
    plan.calls.append(_NOOP_CALL)
    deps.append(sinks)
    users.append([])
    for p in sinks:
        users[p].append(plan.end)

    succ1: list[list[int]] = [[] for _ in deps]
    succn: list[list[tuple[int, int]]] = [[] for _ in deps]
    for c, ds in enumerate(deps):
        if len(ds) == 1:
            succ1[ds[0]].append(c)
        elif len(ds) > 1:
            m = len(plan.tokens)
            plan.tokens.append(list(range(len(ds))))
            for p in ds:
                succn[p].append((c, m))
    plan.succ1 = [tuple(s) for s in succ1]
    plan.succn = [tuple(s) for s in succn]
    plan.users = [tuple(u) for u in users]
    # Ready at start: no producers (If nodes are launched by their gates, never directly).
    # Reversed, so the run loop (which pops from the end) starts with the first node.
    plan.initial = [
        i for i, ds in enumerate(deps) if not ds and not (i < n and _is_if(instrs[i].node))
    ][::-1]
    return plan


def _is_if(node: Node) -> bool:
    return node.op_type == "If" and node.domain == ""


def _add_if_gates(
    plan: Plan,
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
    gates = IfGates(i, in_slots[0], (first, first + 1, first + 2), len(plan.ifs))
    for role, ds in enumerate(gate_deps):
        plan.kinds.append(GATE)
        plan.calls.append(_NOOP_CALL)
        plan.gate_of[first + role] = (gates, role)
        deps.append(ds)
    return gates
