"""Running a prepared program while keeping every value: the probe behind planning.

``run_env`` executes a Program's instructions like ``Program.run`` (same errors, naming
the node) but returns the whole environment, so the caller can see the shape and dtype of
every value: the memory planner plans from what the kernels really produced for an input
signature, never from a guess. ``value_slots`` maps value ids to environment slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ExecutionError
from .program import Program

__all__ = ["run_env", "value_slots"]


def value_slots(program: Program) -> dict[int, int]:
    """``id(value) -> slot`` for every value the program's top level reads or writes."""
    slots: dict[int, int] = {}
    for v, s in zip(program.graph.inputs, program.input_slots):
        slots[id(v)] = s
    for ins in program.instrs:
        node = ins.node
        # ins.ins holds the node's inputs, then its captures: pair each list separately.
        pairs = [*zip(node.inputs, ins.ins), *zip(node.outputs, ins.outs)]
        for x, s in pairs:
            if x is not None:
                slots[id(x)] = s
    for v, s in zip(program.graph.outputs, program.output_slots):
        slots[id(v)] = s
    return slots


def run_env(program: Program, inputs: Sequence[Any], captured: Sequence[Any] = ()) -> list[Any]:
    """Run ``program`` on ``inputs``; return the environment (one entry per slot).

    Thread-safe: the environment is the caller's own list. Raises ExecutionError naming
    the node whose kernel failed."""
    env = program.template.copy()
    for slot, val in zip(program.input_slots, inputs):
        env[slot] = val
    for slot, val in zip(program.capture_slots, captured):
        env[slot] = val
    instr = None
    try:
        for instr in program.instrs:
            r = instr.fn(*[env[i] for i in instr.ins])
            if instr.single:
                env[instr.outs[0]] = r
            else:
                for o, x in zip(instr.outs, r):
                    env[o] = x
    except ExecutionError as e:
        assert instr is not None
        if e.node_name == instr.node.name:
            raise
        raise ExecutionError(instr.node.name, instr.node.op_type, e) from e
    except Exception as e:
        assert instr is not None
        raise ExecutionError(instr.node.name, instr.node.op_type, e) from e
    return env
