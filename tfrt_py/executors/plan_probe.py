"""Running a prepared program while keeping every value: the probe behind planning.

``run_env`` executes a Program's instructions like ``Program.run`` (same errors, naming
the node) but returns the whole environment, so the caller can see the shape and dtype of
every value: the memory planner plans from what the kernels really produced for an input
signature, never from a guess. ``value_slots`` maps value ids to environment slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

    Thread-safe: the environment is the caller's own list. Raises as ``Program.execute``
    (ExecutionError naming the node; the current call's deadline or cancellation)."""
    env = program.env_for(inputs, captured)
    program.execute(env)
    return env
