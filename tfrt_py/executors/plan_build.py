"""From a program and one observed run to a Layout: which values live where.

For one input signature, every value falls in one of three kinds:

* ``arena``: a kernel with ``supports_out`` writes it into a view of the call's arena.
  Only values whose shape the signature fixes (the compiler's ``shape_determined``) and
  whose dtype is a fixed-size one (no strings or objects) qualify.
* ``fresh``: a graph output of such a kernel: written into a new array (or the caller's
  buffer) each call, so the user never sees the arena.
* ``none``: the kernel allocates (no ``out=``; multiple outputs; dynamic shape).

Lifetimes account for aliasing: a kernel called without ``out=`` may return a view of any
input (Reshape, Identity, Slice, a subgraph returning a captured value), so its outputs and
inputs form one alias group, and an arena buffer lives until the last read of any value in
its group. A kernel registered ``inplace`` writes into its input 0's buffer when that
buffer's life ends at this step and shape and dtype match.

A Concat whose inputs are arena values read by it alone, joined along an axis with only
1s before it (channels of one image), is *elided*: its output's buffer is laid out first
and each input is a view of its slice, so the producers write straight into the joined
array and the Concat never runs (SqueezeNet's fire modules, ShuffleNet's branches).

Built once per signature on the thread that made the first call; immutable afterwards.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..records import record
from .plan import Buffer, MemoryPlan, lower_bound, plan_offsets
from .program import Instr, Program

if TYPE_CHECKING:
    from .dims import ShapeModel

__all__ = ["DEL_MIN_BYTES", "Layout", "build_layout"]

#: Unplanned values at least this big are released right after their last read.
DEL_MIN_BYTES = 1 << 16
_RESERVED = (0, 1)  # the program's None and sink slots


@record
class Layout:
    """Where each value of one signature lives, and the arena's memory plan.

    ``kind[slot]``: "arena" | "fresh" for values written with ``out=``; ``views`` lists
    (slot, offset, shape, dtype) of arena values; ``output_kinds[k]`` says how graph
    output ``k`` reaches the user: "fresh" (already theirs), "copy" (always copied: a feed,
    a constant, a possible alias of an earlier output, or a possible view of the arena),
    "user" (copied when it is a view or a nested graph's constant); ``release[step]``
    lists slots to drop after that step.
    """

    plan: MemoryPlan
    kind: dict[int, str]
    shapes: dict[int, tuple[tuple[int, ...], np.dtype]]
    views: list[tuple[int, int, tuple[int, ...], np.dtype]]
    output_kinds: list[str]
    release: dict[int, list[int]] = field(default_factory=dict)
    observed: dict[int, tuple[tuple[int, ...], np.dtype]] = field(default_factory=dict)
    #: instructions the plan never runs: their outputs are this signature's constants
    baked: frozenset[int] = frozenset()
    #: Concat instructions the plan never runs: their inputs were written into their output
    elided: frozenset[int] = frozenset()
    #: per buffer (``plan.buffers`` order) the slot whose size it has (a join's output)
    owners: list[int] = field(default_factory=list)
    #: slot -> its buffer's index; a join's members -> (its buffer, the member's position)
    buffer_index: dict[int, int] = field(default_factory=dict)
    #: a joined buffer's owner slot -> its member slots in order
    members: dict[int, list[int]] = field(default_factory=dict)


class _Groups:
    """Union-find over slots (alias groups)."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, s: int) -> int:
        p = self.parent.setdefault(s, s)
        while p != self.parent[p]:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        self.parent[s] = p
        return p

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _plannable(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic)) and not x.dtype.hasobject


def build_layout(
    program: Program,
    env: list[Any],
    determined: set[int],
    signature: tuple[Any, ...],
    computed_once: AbstractSet[int] = frozenset(),
    model: ShapeModel | None = None,
) -> Layout:
    """The layout of ``program`` for ``signature``, from ``env`` (a probe run's values),
    ``determined`` (ids of values whose shape the signature fixes) and ``computed_once``
    (ids of values whose data it fixes: instructions producing only such values, small,
    and not graph outputs, are *baked*: the plan keeps their probe values as constants and
    never runs them).

    With ``model`` (``executors.dims``) the layout is one for every signature of the
    model's dim variables: only values whose shape it fits are planned, a kernel runs in
    place only where the shapes agree at every dim, a Concat is elided only where the dims
    before its axis are 1 at every dim, and only instructions that can run before the
    program (their inputs are constants, feeds or baked) are baked: an instance computes
    them once per signature (``plan_generic``)."""
    instrs = program.instrs
    out_set = set(program.output_slots)
    baked = _baked(program, env, computed_once, out_set)
    if model is not None:
        baked = _computable(program, baked, model)
    fixed = _fixed_slots(program, baked)
    last = _last_reads(program)
    kind, shapes, groups = _classify(program, env, determined, baked, model)
    joins = _elidable_concats(instrs, kind, shapes, last, baked, model)
    arena = _Arena(kind, shapes, joins, _Lifetimes(groups, last), model)
    arena.lay_out(instrs)
    buffers = arena.buffers
    arena_bytes = plan_offsets(buffers)
    position = {id(b): k for k, b in enumerate(buffers)}
    buffer_index = {s: position[id(b)] for s, b in arena.buffer_of.items()}
    views = [
        (s, b.offset + arena.member_offset.get(s, 0), shapes[s][0], shapes[s][1])
        for s, b in arena.buffer_of.items()
    ]
    output_kinds = _output_kinds(program.output_slots, fixed, kind, set(arena.buffer_of), groups)
    release = _releases(program, env, baked, kind, last, model)
    plan = MemoryPlan(
        signature,
        arena_bytes,
        lower_bound(buffers),
        buffers,
        n_inplace=arena.n_inplace,
        n_fresh=sum(1 for k in kind.values() if k == "fresh"),
        n_unplanned=sum(
            1 for ins in instrs for o in ins.outs if o not in kind and o not in _RESERVED
        ),
        n_joined=len(joins),
    )
    observed = {
        s: (tuple(x.shape), x.dtype)
        for s, x in enumerate(env)
        if isinstance(x, (np.ndarray, np.generic))
    }
    return Layout(
        plan,
        kind,
        shapes,
        views,
        output_kinds,
        release,
        observed,
        baked,
        frozenset(joins),
        arena.owners,
        buffer_index,
        arena.members_of,
    )


def _fixed_slots(program: Program, baked: AbstractSet[int]) -> set[int]:
    """The slots whose values no call computes: feeds, constants and baked outputs."""
    fixed = set(program.input_slots) | {
        s for s, t in enumerate(program.template) if t is not None and s not in _RESERVED
    }
    fixed.update(s for i in baked for s in program.instrs[i].outs if s not in _RESERVED)
    return fixed


def _last_reads(program: Program) -> dict[int, int]:
    """Slot -> the step of its last read (graph outputs: one past the last step)."""
    last: dict[int, int] = {}
    for i, ins in enumerate(program.instrs):
        for s in ins.ins:
            last[s] = i
    for s in program.output_slots:
        last[s] = len(program.instrs)
    return last


def _classify(
    program: Program,
    env: list[Any],
    determined: set[int],
    baked: AbstractSet[int],
    model: ShapeModel | None,
) -> tuple[dict[int, str], dict[int, tuple[tuple[int, ...], np.dtype]], _Groups]:
    """The kind ("arena" | "fresh") and shape of each value written with ``out=``, and the
    alias groups joining every other kernel's outputs to its inputs."""
    out_set = set(program.output_slots)
    kind: dict[int, str] = {}
    shapes: dict[int, tuple[tuple[int, ...], np.dtype]] = {}
    groups = _Groups()
    for i, ins in enumerate(program.instrs):
        if i in baked:
            continue
        v = ins.node.outputs[0] if ins.node.outputs else None
        s = ins.outs[0]
        x = env[s]
        if (
            ins.single
            and ins.flags.supports_out
            and v is not None
            and id(v) in determined
            and _plannable(x)
            and (model is None or s in model.shapes)
        ):
            kind[s] = "fresh" if s in out_set else "arena"
            shapes[s] = (tuple(x.shape), x.dtype)
            continue
        for o in ins.outs:
            if o in _RESERVED:
                continue
            for inp in ins.ins:
                if inp not in _RESERVED:
                    groups.union(o, inp)
    return kind, shapes, groups


class _Lifetimes:
    """When each alias group is last read: an arena buffer lives until then."""

    def __init__(self, groups: _Groups, last: dict[int, int]) -> None:
        self.groups = groups
        self.group_last: dict[int, int] = {}
        for s, t in last.items():
            r = groups.find(s)
            self.group_last[r] = max(self.group_last.get(r, -1), t)

    def end(self, s: int, step: int) -> int:
        """The last step at which slot ``s``, written at ``step``, or an alias of it is read."""
        return max(step, self.group_last.get(self.groups.find(s), step))


class _Arena:
    """The arena's buffers, assigned in program order: per buffer the slot whose size it
    has, per arena slot its buffer, and per joined member its byte offset in the join."""

    def __init__(
        self,
        kind: dict[int, str],
        shapes: dict[int, tuple[tuple[int, ...], np.dtype]],
        joins: dict[int, tuple[int, list[int]]],
        lifetimes: _Lifetimes,
        model: ShapeModel | None,
    ) -> None:
        self.kind = kind
        self.shapes = shapes
        self.joins = joins
        self.lifetimes = lifetimes
        self.model = model
        self.buffers: list[Buffer] = []
        self.owners: list[int] = []
        self.buffer_of: dict[int, Buffer] = {}
        self.members_of: dict[int, list[int]] = {}
        self.member_offset: dict[int, int] = {}
        self.n_inplace = 0

    def lay_out(self, instrs: list[Instr]) -> None:
        """Give each arena value of ``instrs`` its buffer: a slice of its join's, its
        input 0's (a kernel run in place), or a new one."""
        member_of = {m: i for i, (_, ms) in self.joins.items() for m in ms}
        for i, ins in enumerate(instrs):
            s = ins.outs[0]
            if self.kind.get(s) != "arena":
                continue
            name = ins.node.outputs[0].name  # type: ignore[union-attr]
            j = member_of.get(s)
            if j is not None or i in self.joins:  # a slice of a joined buffer, or the join
                self._join(s, name, i, i if j is None else j)
            elif not self._in_place(ins, s, name, i):
                shape, dtype = self.shapes[s]
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                self._add(s, Buffer(nbytes, i, self.lifetimes.end(s, i), [name]))

    def _add(self, s: int, buf: Buffer) -> None:
        self.buffers.append(buf)
        self.owners.append(s)
        self.buffer_of[s] = buf

    def _join(self, s: int, name: str, i: int, j: int) -> None:
        """Slot ``s`` (written at step ``i``) is a member or the output of join ``j``."""
        out_slot, members = self.joins[j]
        joined = self.buffer_of.get(out_slot)
        if joined is None:
            jshape, jdtype = self.shapes[out_slot]
            nbytes = int(np.prod(jshape, dtype=np.int64)) * jdtype.itemsize
            joined = Buffer(nbytes, i, self.lifetimes.end(out_slot, j), [])
            self.buffers.append(joined)
            self.owners.append(out_slot)
            self.members_of[out_slot] = list(members)
            self.buffer_of[out_slot] = joined
            at = 0
            for m in members:
                self.member_offset[m] = at
                at += int(np.prod(self.shapes[m][0], dtype=np.int64)) * jdtype.itemsize
        joined.values.append(name)
        self.buffer_of[s] = joined

    def _in_place(self, ins: Instr, s: int, name: str, i: int) -> bool:
        """Whether ``ins`` (step ``i``) writes ``s`` over its input 0's buffer: an
        ``inplace`` kernel whose input 0's buffer ends here, of the same shape and dtype,
        and aliased by none of its other inputs."""
        s0 = ins.ins[0] if ins.ins else -1
        buf = self.buffer_of.get(s0)
        model = self.model
        groups = self.lifetimes.groups
        if not (
            ins.flags.inplace
            and buf is not None
            and buf.last == i
            and self.shapes[s0] == self.shapes[s]
            and (model is None or model.same_shape(s0, s))
            and all(groups.find(x) != groups.find(s0) for x in ins.ins[1:])
        ):
            return False
        buf.last = self.lifetimes.end(s, i)
        buf.values.append(name)
        self.buffer_of[s] = buf
        self.n_inplace += 1
        return True


def _output_kinds(
    outputs: list[int],
    fixed: set[int],
    kind: dict[int, str],
    in_arena: set[int],
    groups: _Groups,
) -> list[str]:
    """How each graph output reaches the user (``Layout.output_kinds``)."""
    risky_groups = {groups.find(s) for s in fixed | in_arena}
    output_kinds: list[str] = []
    seen: set[int] = set()  # alias groups of earlier outputs: a later one may be the same array
    for s in outputs:
        if groups.find(s) in seen or s in fixed:
            output_kinds.append("copy")
        elif kind.get(s) == "fresh":
            output_kinds.append("fresh")
        elif groups.find(s) in risky_groups:
            output_kinds.append("copy")
        else:
            output_kinds.append("user")
        seen.add(groups.find(s))
    return output_kinds


def _releases(
    program: Program,
    env: list[Any],
    baked: AbstractSet[int],
    kind: dict[int, str],
    last: dict[int, int],
    model: ShapeModel | None,
) -> dict[int, list[int]]:
    """Step -> the unplanned values of at least ``DEL_MIN_BYTES`` last read there."""
    out_set = set(program.output_slots)
    release: dict[int, list[int]] = {}
    for i, ins in enumerate(program.instrs):
        if i in baked:
            continue
        for o in ins.outs:
            x = env[o]
            small = x.nbytes < DEL_MIN_BYTES if isinstance(x, np.ndarray) else True
            if model is not None and isinstance(x, np.ndarray):
                # the probe's size says little of another signature's
                small = small and model.depends.get(o, -1) == 0
            if (
                o in _RESERVED
                or o in kind
                or o in out_set
                or not isinstance(x, np.ndarray)
                or small
            ):
                continue
            release.setdefault(last.get(o, i), []).append(o)
    return release


def _elidable_concats(
    instrs: list[Any],
    kind: dict[int, str],
    shapes: dict[int, tuple[tuple[int, ...], np.dtype]],
    last: dict[int, int],
    baked: AbstractSet[int],
    model: ShapeModel | None = None,
) -> dict[int, tuple[int, list[int]]]:
    """Concat instruction -> (output slot, input slots) for the Concats whose inputs can be
    slices of the output: output and inputs arena values of one dtype, every input read
    by this Concat alone (once) and by nothing after, produced by no other join, the axis
    preceded by 1s only (so each input's slice is contiguous)."""
    readers: dict[int, int] = {}
    for ins in instrs:
        for x in ins.ins:
            readers[x] = readers.get(x, 0) + 1
    joins: dict[int, tuple[int, list[int]]] = {}
    taken: set[int] = set()
    for i, ins in enumerate(instrs):
        node = ins.node
        if i in baked or node.op_type != "Concat" or node.domain != "" or not ins.single:
            continue
        out = ins.outs[0]
        members = list(ins.ins)
        if kind.get(out) != "arena" or len(members) < 2 or len(set(members)) != len(members):
            continue
        shape, dtype = shapes[out]
        axis = int(node.attrs.get("axis", 1))
        axis = axis + len(shape) if axis < 0 else axis
        if not 0 <= axis < len(shape) or any(d != 1 for d in shape[:axis]):
            continue
        sym = None if model is None else model.symbolic(out)
        if model is not None and (sym is None or any(d != 1 for d in sym[:axis])):
            continue  # a leading dim that is 1 only at the probe's dims
        if all(
            kind.get(m) == "arena" and shapes[m][1] == dtype and readers.get(m) == 1
            and last.get(m) == i and m not in taken
            for m in members
        ):  # fmt: skip
            joins[i] = (out, members)
            taken.update(members)
    return joins


#: A value computed once per signature is kept only up to this size (shape arithmetic is
#: a few ints; a big signature-determined tensor is computed per call instead).
BAKE_MAX_BYTES = 1 << 16


def _baked(
    program: Program, env: list[Any], computed_once: AbstractSet[int], out_set: set[int]
) -> frozenset[int]:
    """The instructions whose every output the signature determines (pure, no nested
    graphs), small, and not a graph output: run once by the probe, never again."""
    baked = set()
    for i, ins in enumerate(program.instrs):
        f = ins.flags
        if not f.pure or f.is_async or f.control_flow:
            continue
        vals = [v for v in ins.node.outputs if v is not None]
        if not vals or any(id(v) not in computed_once for v in vals):
            continue
        if any(s in out_set for s in ins.outs):
            continue
        xs = [env[s] for s in ins.outs if s not in _RESERVED]
        if all(isinstance(x, (np.ndarray, np.generic)) and x.nbytes <= BAKE_MAX_BYTES
               for x in xs):  # fmt: skip
            baked.add(i)
    return frozenset(baked)


def _computable(program: Program, baked: frozenset[int], model: ShapeModel) -> frozenset[int]:
    """The baked instructions whose outputs the model's formulas give, or whose inputs are
    constants, feeds or outputs of earlier ones among them: a generic plan's instance
    evaluates or runs them, once per signature, before the program."""
    ready = (
        set(program.input_slots)
        | {s for s, t in enumerate(program.template) if t is not None}
        | set(_RESERVED)
    )
    keep = set()
    for i, ins in enumerate(program.instrs):
        if i in baked and (
            all(s in model.values for s in ins.outs if s not in _RESERVED)
            or all(s in ready for s in ins.ins)
        ):
            keep.add(i)
            ready.update(ins.outs)
    return frozenset(keep)
