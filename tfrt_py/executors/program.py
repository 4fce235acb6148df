"""The prepared program every executor shares, and the topological-order interpreter.

``compile_program`` runs once per (sub)graph at load: it numbers every Value with a slot,
builds each node's kernel (``KernelContext`` -> compute function), and records per node
the input and output slots. Running is then a loop over a flat list of instructions with
an environment list copied from a template: no dict lookups, no attribute parsing.

A Program is immutable after compilation, so one Program may run on many threads at once;
each run owns its environment list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..calls import CallCancelled, current_call
from ..errors import DeadlineExceeded, ExecutionError, UnsupportedOpError
from ..ir import Graph, Node, TensorType, Value
from ..kernels import KernelContext, KernelRegistry
from ..kernels.base import ComputeFn, InlineFn, KernelFlags

__all__ = [
    "Instr",
    "Program",
    "Shaped",
    "compile_program",
    "constant_ids",
    "named_deadline",
    "node_captures",
    "owned_outputs",
    "user_output",
]

_NONE_SLOT = 0  # always holds None: omitted optional inputs read it
_SINK_SLOT = 1  # omitted optional outputs are written here and never read


class Instr:
    """One kernel invocation: read ``ins`` slots, call ``fn``, write ``outs`` slots.
    ``inline``: the statements the kernel's builder offered for generated code, or None."""

    __slots__ = ("flags", "fn", "inline", "ins", "node", "outs", "single")

    def __init__(
        self,
        fn: ComputeFn,
        ins: tuple[int, ...],
        outs: tuple[int, ...],
        node: Node,
        flags: KernelFlags,
        inline: InlineFn | None = None,
    ) -> None:
        self.fn = fn
        self.inline = inline
        self.ins = ins
        self.outs = outs
        self.single = len(outs) == 1
        self.node = node
        self.flags = flags


def node_captures(node: Node) -> list[Value]:
    """The outer-scope values a node's nested graphs use, in a fixed order. They are passed
    to the node's kernel after its ONNX inputs."""
    seen: dict[int, Value] = {}
    for _, sub in node.subgraphs():
        for v in sub.free_values():
            seen.setdefault(id(v), v)
    return list(seen.values())


class Program:
    """A compiled graph: slots, constants template, instructions, I/O slots.

    ``run(inputs, captured)`` takes the graph inputs in order (and, for nested graphs, the
    owning node's captured values) and returns the outputs in order.
    """

    def __init__(
        self,
        graph: Graph,
        n_slots: int,
        template: list[Any],
        instrs: list[Instr],
        input_slots: list[int],
        capture_slots: list[int],
        output_slots: list[int],
        nested: bool = False,
    ) -> None:
        self.graph = graph
        #: a nested graph's program (If branch, Loop/Scan body): a deadline noticed here is
        #: reported as the enclosing top-level node's, not as a body node's
        self.nested = nested
        self.n_slots = n_slots
        self.template = template
        self.instrs = instrs
        self.input_slots = input_slots
        self.capture_slots = capture_slots
        self.output_slots = output_slots
        # (fn, ins, out slot or out slots, single, slots to clear after it) tuples: the loop
        # unpacks without lookups; ``_freeing`` (made on first use) clears dead values.
        self._plain: list[Any] = [
            (i.fn, i.ins, i.outs[0] if i.single else i.outs, i.single, ()) for i in instrs
        ]
        self._freeing: list[Any] | None = None
        #: ``run_shapes``' freeing lists, by the extra slots whose values it keeps.
        self._shape_runs: dict[frozenset[int], list[Any]] = {}

    def run(self, inputs: Sequence[Any], captured: Sequence[Any] = ()) -> list[Any]:
        """Run on ``inputs`` (and a nested graph's ``captured`` values); the outputs."""
        env = self.env_for(inputs, captured)
        self.execute(env)
        return [env[s] for s in self.output_slots]

    def env_for(self, inputs: Sequence[Any], captured: Sequence[Any] = ()) -> list[Any]:
        """A fresh environment: the constants template with inputs and captures set."""
        env = self.template.copy()
        for slot, val in zip(self.input_slots, inputs):
            env[slot] = val
        for slot, val in zip(self.capture_slots, captured):
            env[slot] = val
        return env

    def run_freeing(self, inputs: Sequence[Any]) -> list[Any]:
        """``run`` that drops each value after its last reader, so a run holds only the
        live values (as NumPy code would): the sync interpreter's way to run a program too
        long to plan. Same errors as ``execute``."""
        env = self.env_for(inputs)
        self.execute(env, free=True)
        return [env[s] for s in self.output_slots]

    def run_shapes(self, inputs: Sequence[Any], values: frozenset[int]) -> list[Any]:
        """The environment of a run that keeps the values of the inputs, constants,
        outputs and ``values`` slots; every other value is replaced, after its last
        reader, by a ``Shaped`` holding only its shape (``np.shape`` reads it). A probe
        that needs every shape but few values (``plan_generic.verify``) then holds only
        the live values, as NumPy code would: on a big batch, keeping every activation
        touched hundreds of MB of fresh pages. Same errors as ``execute``."""
        plain = self._shape_runs.get(values)
        if plain is None:
            plain = self._shape_runs[values] = self._freeing_instrs(values)
        env = self.env_for(inputs)
        self.execute(env, instrs=plain, shapes=True)
        return env

    def dead_after(self) -> list[tuple[int, ...]]:
        """Per instruction, the slots whose value no later instruction reads and that are
        no input, output or constant: what ``run_freeing`` clears after it."""
        return [t[4] for t in self._freeing_instrs()]

    def _freeing_instrs(self, extra: frozenset[int] = frozenset()) -> list[Any]:
        if extra or self._freeing is None:
            keep = {*self.input_slots, *self.capture_slots, *self.output_slots, *extra}
            keep |= {s for s, t in enumerate(self.template) if t is not None}
            last: dict[int, int] = {}
            for k, ins in enumerate(self.instrs):
                for s in (*ins.ins, *ins.outs):
                    last[s] = k
            frees: list[list[int]] = [[] for _ in self.instrs]
            for s, k in last.items():
                if s > _SINK_SLOT and s not in keep:
                    frees[k].append(s)
            made = [(*t[:4], tuple(f)) for t, f in zip(self._plain, frees)]
            if extra:
                return made
            self._freeing = made
        return self._freeing

    def execute(
        self,
        env: list[Any],
        start: int = 0,
        stop: int | None = None,
        *,
        free: bool = False,
        instrs: list[Any] | None = None,
        shapes: bool = False,
        at: Sequence[int] | None = None,
    ) -> None:
        """Run the instructions ``start:stop`` (default: all) in order over ``env`` (the
        caller's own list); ``free``: clear each value's slot after its last reader
        (``instrs``: a freeing list of ``_freeing_instrs``; ``shapes``: leave a ``Shaped``
        there instead of None). ``at``: the program indices of ``instrs``' entries when
        they are not the program's in order (``execute_each``), for naming a failure.

        Raises ExecutionError naming the node whose kernel failed. The thread's current
        call (``tfrt_py.calls``), if any, is checked before each kernel: its deadline or
        cancellation raises DeadlineExceeded / CallCancelled, never wrapped."""
        call = current_call()
        step = start
        plain = instrs if instrs is not None else self._freeing_instrs() if free else self._plain
        if start != 0 or stop is not None:
            plain = plain[start:stop]
        try:
            for fn, ins, outs, single, dead in plain:
                if call is not None and call.stop:
                    stop_at = step if at is None else at[step]
                    call.raise_stop(None if self.nested else self.instrs[stop_at].node)
                r = fn(*[env[i] for i in ins])
                if single:
                    env[outs] = r
                else:
                    for o, x in zip(outs, r):
                        env[o] = x
                if dead:
                    if shapes:
                        _leave_shapes(env, dead)
                    else:
                        for s in dead:
                            env[s] = None
                step += 1
        except CallCancelled:
            raise
        except DeadlineExceeded as e:
            if self.nested:
                raise
            raise named_deadline(e, self.instrs[step if at is None else at[step]].node) from None
        except Exception as e:
            named = _naming(e, self.instrs[step if at is None else at[step]].node)
            if named is e:
                raise
            raise named from e

    def execute_each(self, env: list[Any], indices: Sequence[int]) -> None:
        """``execute`` for the instructions at ``indices`` (in program order, others
        skipped), over ``env``: a generic plan's baked instructions."""
        plain = self._plain
        self.execute(env, instrs=[plain[k] for k in indices], at=indices)


def _naming(e: Exception, node: Node) -> Exception:
    """What a failure ``e`` of ``node``'s kernel raises: ``e`` itself when it is an
    ExecutionError naming ``node``, else an ExecutionError naming ``node`` around it."""
    if isinstance(e, ExecutionError) and e.node_name == node.name:
        return e
    return ExecutionError(node.name, node.op_type, e)


class Shaped:
    """What ``Program.run_shapes`` leaves of a value it freed: its shape."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


def _leave_shapes(env: list[Any], slots: Sequence[int]) -> None:
    """Replace each array in ``slots`` by its ``Shaped`` (other values stay: small)."""
    for s in slots:
        x = env[s]
        if isinstance(x, np.ndarray):
            env[s] = Shaped(x.shape)


def named_deadline(e: DeadlineExceeded, node: Node) -> DeadlineExceeded:
    """``e`` naming ``node`` when it names none yet (raised inside a kernel, e.g. between
    a Loop's iterations, which does not know its node's name)."""
    if e.node_name is not None:
        return e
    return DeadlineExceeded(e.timeout, node.name, node.op_type)


def compile_program(
    graph: Graph,
    registry: KernelRegistry,
    captures: Sequence[Value] = (),
    *,
    nested: bool = False,
) -> Program:
    """Compile ``graph``; ``captures`` are outer-scope values it receives at run time.

    Kernels are built here (load time): an op or opset with no kernel, or an attribute
    combination a kernel cannot run, raises UnsupportedOpError naming the node.
    """
    slots: dict[int, int] = {}
    template: list[Any] = [None, None]

    def slot_of(v: Value) -> int:
        s = slots.get(id(v))
        if s is None:
            s = len(template)
            slots[id(v)] = s
            template.append(v.const if v.const is not None else None)
        return s

    input_slots = [slot_of(v) for v in graph.inputs]
    capture_slots = [slot_of(v) for v in captures]
    for c in graph.constants:
        slot_of(c)

    def compile_sub(node: Node, sub: Graph) -> Any:
        prog = compile_program(sub, registry, node_captures(node), nested=True)
        return lambda inputs, captured: prog.run(inputs, captured)

    instrs: list[Instr] = []
    for node in graph.nodes:
        kdef = registry.lookup(node.domain, node.op_type, node.opset, node.name)
        ctx = KernelContext(node, subgraph_compiler=compile_sub)
        try:
            fn = kdef.build(ctx)
        except UnsupportedOpError:
            raise
        except Exception as e:
            raise UnsupportedOpError(
                node.op_type, node.domain, node.opset, node.name, f"{type(e).__name__}: {e}"
            ) from e
        ins = [_NONE_SLOT if v is None else slot_of(v) for v in node.inputs]
        ins += [slot_of(v) for v in node_captures(node)]
        outs = tuple(_SINK_SLOT if v is None else slot_of(v) for v in node.outputs)
        instrs.append(Instr(fn, tuple(ins), outs, node, kdef.flags, ctx.inline))
    output_slots = [slot_of(v) for v in graph.outputs]
    return Program(
        graph, len(template), template, instrs, input_slots, capture_slots, output_slots, nested
    )


def user_output(v: Any, ty: object, constants: frozenset[int] = frozenset()) -> Any:
    """Make a graph output safe to hand to the user: an ndarray they own (tensors only).
    A view, or one of the model's constant arrays (``constants``: their ids), is copied."""
    if isinstance(ty, TensorType) or ty is None:
        if type(v) is not np.ndarray:
            if v is None or isinstance(v, (list, dict)):
                return v
            v = np.asarray(v)
        if v.base is not None or id(v) in constants:
            v = v.copy()
    return v


def constant_ids(graph: Graph) -> frozenset[int]:
    """The ids of every constant array of ``graph`` and its nested graphs. A kernel may
    return one of them unchanged (Identity of a constant, an If branch returning its own
    constant); such an output must be copied before the user may write to it."""
    ids = {id(c.const) for c in graph.constants if c.const is not None}
    for node in graph.walk():
        for _, sub in node.subgraphs():
            ids.update(id(c.const) for c in sub.constants if c.const is not None)
    return frozenset(ids)


def owned_outputs(
    values: Sequence[Any], types: Sequence[object], feeds: Sequence[Any], constants: frozenset[int]
) -> list[Any]:
    """``values`` made safe to hand to the user when nothing is known of their origin (the
    dataflow executor, the topological interpreter): every ndarray is the user's own and
    no two share memory. An array is copied when it is a view, a feed (a pass-through
    Identity/Cast/Expand, an If branch or a zero-trip Loop returning it), a constant, or an
    array already returned for an earlier output."""
    out: list[Any] = []
    for v, ty in zip(values, types):
        if type(v) is np.ndarray and (any(v is f for f in feeds) or any(v is o for o in out)):
            v = v.copy()
        out.append(user_output(v, ty, constants))
    return out
