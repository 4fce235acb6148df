"""Straight-line code for a program's unplanned calls: the sync interpreter's calls that
no memory plan serves (a map or sequence input, which has no signature; a cold start's
stand-in before its switch; a signature seen once) run one generated function instead of
``Program.run_freeing``'s loop over the instruction list.

``straight_line(program)`` returns ``fn(inputs) -> outputs`` (both in the program's
order), or None for a program it does not take (over ``MAX_INSTRS`` instructions, a
nested graph's captures). Each value is a local variable ``s<slot>``, each constant a
global ``C<slot>``, each kernel a global ``K<index>``; a value is deleted after its last
reader, as ``run_freeing`` drops it. The source holds only those names and integers:
never a name, attribute or string of the model. No call context is checked between the
kernels and no failure is named: the caller runs it only for a call without a deadline
or cancellation, and on any exception runs ``run_freeing`` again, which raises the
named ``ExecutionError`` (so only for a program whose kernels are pure). Load-time code;
the function is reentrant (any thread).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["MAX_INSTRS", "straight_line"]

#: Longer programs keep the loop (their source would cost more to compile than it saves).
MAX_INSTRS = 400

_NONE_SLOT, _SINK_SLOT = 0, 1  # as ``program``'s


def straight_line(program: Any) -> Callable[[Sequence[Any]], list[Any]] | None:
    """The generated function of ``program`` (a ``Program``), or None (see the module
    docstring)."""
    if len(program.instrs) > MAX_INSTRS or program.capture_slots:
        return None
    env: dict[str, Any] = {}
    consts = {s for s, t in enumerate(program.template) if t is not None and s > _SINK_SLOT}
    env.update({f"C{s}": program.template[s] for s in consts})

    def name(s: int) -> str:
        if s == _NONE_SLOT:
            return "None"
        return f"C{s}" if s in consts else f"s{s}"

    dead = program.dead_after()
    n_in = len(program.input_slots)
    lines = ["def straight(inputs):"]
    if n_in:
        lines.append(f"    {', '.join(name(s) for s in program.input_slots)}, = inputs")
    for k, ins in enumerate(program.instrs):
        env[f"K{k}"] = ins.fn
        outs = ", ".join("_" if s == _SINK_SLOT else name(s) for s in ins.outs)
        target = outs if ins.single else outs + ","
        lines.append(f"    {target} = K{k}({', '.join(name(s) for s in ins.ins)})")
        if dead[k]:
            lines.append(f"    del {', '.join(name(s) for s in sorted(dead[k]))}")
    lines.append(f"    return [{', '.join(name(s) for s in program.output_slots)}]")
    exec(compile("\n".join(lines), "<tfrt_py straight-line>", "exec"), env)
    fn: Callable[[Sequence[Any]], list[Any]] = env["straight"]
    return fn
