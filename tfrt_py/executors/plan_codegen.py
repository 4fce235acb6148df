"""Generate the straight-line Python function that runs one planned signature.

The generated source defines ``_make(...)``, whose parameters are everything the code
uses (kernels ``k<i>``, constants ``c<slot>``, expected dtypes and shapes, input and
output names ``_n<j>``/``_o<k>``, helpers), and which returns two closures over them. The
source holds no model text: names are bound as closure constants (``feeds[_n0]`` costs
what ``feeds['x']`` does), never pasted in. The closures:

* ``run(feeds, outs=None)``: the fast path. Checks in line that ``feeds`` has exactly this
  signature (``type(x) is ndarray``, ``x.dtype is d``, ``x.shape == h``; a generic plan:
  the shapes' instance, one made by ``_adopt`` for a new signature of a verified bucket),
  else hands the call to ``_slow``; takes an arena from the free list; calls each kernel
  in program order with ``out=`` its arena view; returns the outputs dict.
* ``run_checked(args, outs)``: the same body for validated feeds and optional caller
  output buffers; returns the raw output values for ``_finish``.
* ``run_call(args, outs, call)``: ``run_checked`` under a ``tfrt_py.calls.CallContext``
  (a deadline, or a canceller): ``call.stop`` is read before each kernel (one attribute
  load: the timer thread sets it) and the call is the thread's current call meanwhile, so
  Loop/Scan kernels check it between iterations. Calls without one never pay for it.

Closure variables are cell loads, not dict lookups: a call does no per-kernel lookup,
allocates no futures and takes no locks. The arena free list is a plain list: ``pop`` and
``append`` are atomic, so concurrent calls each get their own arena (a new one when the
list is empty); the list keeps as many arenas as calls ever ran at once.

A kernel's builder may offer an inline form (``kernels.base.InlineFn``, kept on the
instruction as ``Instr.inline``): statements that compute its output into ``{out}`` from
``{in0}``, ``{in1}``, ... using the names in ``Inline.env``. The generator pastes them in
place of the call (the fused kernels in ``kernels/fused/`` do this), saving the Python
frame of the kernel call. The statements are the kernel's own fixed text: every value they
use (attributes such as alpha included) reaches them through ``env``, which the generator
binds under names of its own (``i<node>_<j>``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..calls import set_current
from ..records import record
from .plan_build import Layout
from .program import Program

__all__ = ["Generated", "Generic", "generate", "instance_slots"]


@record
class Generated:
    """The generated entry points and what maps a failing line back to its node."""

    run: Callable[..., Any]
    run_checked: Callable[..., Any]
    run_call: Callable[..., Any]
    source: str
    line_node: dict[tuple[int, int], int]  # (id of the code object, line) -> instruction index


_KEYWORD_OUT_UFUNCS = (np.maximum, np.minimum)
#: Programs binding more names than this (kernels, constants, shapes) bind them as the
#: generated module's globals instead of closure cells (``generate``).
MAX_CLOSURE_BINDS = 2000


def _out_positional(fn: Any, n_args: int) -> bool:
    """Whether ``out`` can be passed positionally right after ``n_args`` inputs (cheaper
    than a keyword in CPython's call protocol)."""
    if isinstance(fn, np.ufunc):
        # NumPy 2.4 deprecates a positional out for maximum/minimum (variadic-looking calls).
        return fn.nin == n_args and fn.nout == 1 and fn not in _KEYWORD_OUT_UFUNCS
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if len(params) <= n_args:
        return False
    pos = inspect.Parameter.POSITIONAL_OR_KEYWORD
    p = params[n_args]
    return p.name == "out" and p.kind == pos and all(q.kind == pos for q in params[:n_args])


class _Emitter:
    def __init__(
        self, program: Program, layout: Layout, env: list[Any], generic: Generic | None
    ) -> None:
        self.program = program
        self.layout = layout
        self.generic = generic
        self.binds: dict[str, Any] = {}
        #: slot -> the constant it holds: the model's, and this signature's (baked)
        self.consts: dict[int, Any] = {
            s: t for s, t in enumerate(program.template) if t is not None and s > 1
        }
        #: generic plans: baked slots, whose values come with the call's instance
        self.per_call: set[int] = set()
        if generic is None:
            for i in layout.baked:
                for s in program.instrs[i].outs:
                    if s > 1:
                        self.consts[s] = env[s]
        else:
            self.per_call.update(instance_slots(program, layout)[0])
        self.input_slots = set(program.input_slots)

    def var(self, s: int) -> str:
        if s == 0:
            return "None"
        if s == 1:
            return "_"
        if s in self.per_call:
            return f"b{s}"
        if s in self.consts and s not in self.input_slots:
            name = f"c{s}"
            self.binds[name] = self.consts[s]
            return name
        return f"v{s}"

    def body(self, fresh_src: Callable[[int], str]) -> list[tuple[str, int]]:
        """(line, instruction index) pairs; ``fresh_src(slot)`` is the expression giving a
        fresh output's buffer."""
        lines: list[tuple[str, int]] = []
        lay = self.layout
        for i, ins in enumerate(self.program.instrs):
            if i in lay.baked or i in lay.elided:
                continue
            args = [self.var(s) for s in ins.ins]
            k = f"k{i}"
            self.binds[k] = ins.fn
            s = ins.outs[0]
            kind = lay.kind.get(s) if ins.single else None
            if kind is None:
                outs = ", ".join(self.var(o) for o in ins.outs)
                if not ins.single:
                    outs += "," if len(ins.outs) == 1 else ""
                lines.append((f"{outs} = {k}({', '.join(args)})", i))
            else:
                out = self.var(s)
                if kind == "fresh":
                    shape, dtype = lay.shapes[s]
                    self.binds[f"d{s}"] = dtype
                    if self.generic is None:
                        self.binds[f"h{s}"] = shape
                    lines.append((f"{out} = {fresh_src(s)}", i))
                lines += [(ln, i) for ln in self._call(i, ins.fn, k, args, out, s)]
            for r in lay.release.get(i, ()):
                lines.append((f"del {self.var(r)}", i))
        return lines

    def _call(self, i: int, fn: Any, k: str, args: list[str], out: str, s: int) -> list[str]:
        inline = self.program.instrs[i].inline
        if inline is not None:
            shapes = [self._shape(x) for x in self.program.instrs[i].ins]
            out_shape = self.layout.shapes[s][0]
            if self.generic is not None:
                out_shape = self.generic.symbolic(s)  # type: ignore[assignment]
            got = inline(shapes, out_shape, self.layout.shapes[s][1])
            if got is not None:
                names = {key: f"i{i}_{j}" for j, key in enumerate(got.env)}
                for key, val in got.env.items():
                    self.binds[names[key]] = val
                fields = {f"in{j}": a for j, a in enumerate(args)} | {"out": out} | names
                return [ln.format_map(fields) for ln in got.lines]  # no copy of fields per line
        if _out_positional(fn, len(args)):
            return [f"{out} = {k}({', '.join([*args, out])})"]
        return [f"{out} = {k}({', '.join([*args, f'out={out}'])})"]

    def _shape(self, x: int) -> Any:
        """What the code may assume of slot ``x``'s shape (None: nothing): this
        signature's, or for a generic plan the dims that hold at every signature."""
        if self.generic is not None:
            return self._generic_shape(x)
        seen = self.layout.observed
        return seen[x][0] if x in seen else None

    def _generic_shape(self, x: int) -> Any:
        assert self.generic is not None
        if x in self.input_slots:
            return self.generic.input_shape(self.program.input_slots.index(x))
        if x in self.consts:
            return tuple(np.shape(self.consts[x]))
        return self.generic.symbolic(x)


class _Source:
    """The lines of the generated ``_make`` (its parameters still ``__BINDS__``), written
    entry by entry; the names a line uses are bound in the emitter's ``binds``."""

    def __init__(
        self,
        em: _Emitter,
        program: Program,
        layout: Layout,
        per_call: list[str],
        input_names: list[str],
        output_names: list[str],
    ) -> None:
        self.em = em
        self.program = program
        self.layout = layout
        self.generic = em.generic
        #: an instance's per-signature names, in the order of its ``consts``
        self.per_call = per_call
        self.input_names = input_names
        self.output_names = output_names
        self.arena_vars = [f"v{s}" for s, *_ in layout.views]
        self.lines: list[str] = ["def _make(" + "__BINDS__" + "):"]

    def fast_entry(self, body: list[tuple[str, int]]) -> dict[int, int]:
        """``run(feeds, outs=None)``: its signature checked in line; returns its line ->
        instruction index map."""
        em, src, in_slots = self.em, self.lines, self.program.input_slots
        n_in = len(self.input_names)
        src.append("  def run(feeds, outs=None):")
        src.append("    if outs is not None:")
        src.append("        return _slow(feeds, outs)")
        src.append("    try:")
        src.append(f"        if len(feeds) != {n_in}:")
        src.append("            return _slow(feeds, outs)")
        for j, (name, s) in enumerate(zip(self.input_names, in_slots)):
            em.binds[f"_n{j}"] = name  # names are model text: bound, never pasted
            src.append(f"        v{s} = feeds[_n{j}]")
        src.append("    except Exception:")
        src.append("        return _slow(feeds, outs)")
        if n_in:
            conds = []
            for (shape, dtype), s in zip(self.layout.plan.signature, in_slots):
                em.binds[f"d{s}"] = dtype
                cond = f"type(v{s}) is not _ndarray or v{s}.dtype is not d{s}"
                if self.generic is None:
                    em.binds[f"h{s}"] = tuple(shape)
                    cond += f" or v{s}.shape != h{s}"
                conds.append(cond)
            src.append(f"    if {' or '.join(conds)}:")
            src.append("        return _slow(feeds, outs)")
        if self.generic is not None:
            key = ", ".join(f"v{s}.shape" for s in in_slots)
            src.append(f"    _k = ({key}{',' if n_in == 1 else ''})")
            args = ", ".join(f"v{s}" for s in in_slots)
            src.append("    _i = _insts.get(_k)")
            src.append("    if _i is None:")
            src.append(f"        _i = _adopt(_k, ({args}{',' if n_in == 1 else ''}))")
            src.append("        if _i is None:")
            src.append("            return _slow(feeds, outs)")
            self._unpack_instance()
        where = self._body("run", body)
        results = []
        for k, (s, kind) in enumerate(zip(self.program.output_slots, self.layout.output_kinds)):
            v = em.var(s)
            results.append(
                v if kind == "fresh" else f"_cp({v}, {k})" if kind == "copy" else f"_uo({v}, {k})"
            )
        for k, name in enumerate(self.output_names):
            em.binds[f"_o{k}"] = name
        pairs = ", ".join(f"_o{k}: {r}" for k, r in enumerate(results))
        src.append(f"    return {{{pairs}}}")
        return where

    def checked_entry(
        self, fn_name: str, body: list[tuple[str, int]], call: bool = False
    ) -> dict[int, int]:
        """``run_checked(args, outs)``, or with ``call`` ``run_call(args, outs, _c)`` (and
        the instance ``_i`` last for a generic plan); returns its line -> instruction
        index map."""
        src = self.lines
        extra = ", _i" if self.generic is not None else ""
        src.append(f"  def {fn_name}(args, outs{', _c' if call else ''}{extra}):")
        if self.input_names:
            src.append(f"    {', '.join(f'v{s}' for s in self.program.input_slots)}, = args")
        src.append(f"    {', '.join(f'o{k}' for k in range(len(self.output_names)))}, = outs")
        if self.generic is not None:
            src.append("    _k = _i.key")
            self._unpack_instance()
        where = self._body(fn_name, body, call)
        src.append(f"    return [{', '.join(self.em.var(s) for s in self.program.output_slots)}]")
        return where

    def _unpack_instance(self) -> None:
        if self.per_call:
            self.lines.append(f"    {', '.join(self.per_call)}, = _i.consts")

    def _take_arena(self) -> None:
        arena_vars, src = self.arena_vars, self.lines
        if not arena_vars:
            return
        src.extend(["    try:", "        _arena = _pop()", "    except IndexError:",
                    "        _arena = _new_arena()"])  # fmt: skip
        if self.generic is None:
            views = "_arena"
        else:
            src.extend(["    _vs = _arena.views.get(_k)", "    if _vs is None:",
                        "        _vs = _arena.views_for(_i)"])  # fmt: skip
            views = "_vs"
        src.append(f"    {', '.join(arena_vars)}{',' if len(arena_vars) == 1 else ''} = {views}")

    def _body(
        self, fn_name: str, body: list[tuple[str, int]], call: bool = False
    ) -> dict[int, int]:
        """The body of an entry; ``call``: it runs under a CallContext ``_c`` (current on
        this thread meanwhile) whose ``stop`` is checked before each kernel. Returns its
        line -> instruction index map."""
        src = self.lines
        where: dict[int, int] = {}
        self._take_arena()
        if call:
            src.append("    _prev = _setcur(_c)")
        src.append("    try:")
        last = -1
        for line, i in body:
            if call and i != last:
                src.append(f"        if _c.stop: _c.raise_stop(_nodes[{i}])")
                where[len(src)] = i
                last = i
            src.append("        " + line)
            where[len(src)] = i
        if not body:
            src.append("        pass")
        src.append("    except BaseException as _e:")
        if call:
            src.append("        _setcur(_prev)")
        if self.arena_vars:
            src.append("        _push(_arena)")
        src.append(f"        raise _failed(_e, {fn_name!r})")
        if call:
            src.append("    _setcur(_prev)")
        if self.arena_vars:
            src.append("    _push(_arena)")
        return where


class Generic(Protocol):
    """What code generation needs of a generic plan (``plan_generic.GenericPlan``): the
    shapes that hold at every signature, and the per-signature instance table."""

    insts: dict[Any, Any]

    def symbolic(self, slot: int) -> tuple[int | None, ...] | None: ...

    def input_shape(self, k: int) -> tuple[int | None, ...] | None: ...


def instance_slots(program: Program, layout: Layout) -> tuple[list[int], list[int]]:
    """A generic plan's per-signature slots, in the order of an instance's ``consts``:
    the baked slots the program reads (their values; shape arithmetic read only by other
    baked instructions is not passed), then the fresh output slots (their shapes)."""
    made = {s for i in layout.baked for s in program.instrs[i].outs if s > 1}
    skip = layout.baked | layout.elided
    read = {s for i, ins in enumerate(program.instrs) if i not in skip for s in ins.ins}
    fresh = sorted(s for s, k in layout.kind.items() if k == "fresh")
    return sorted(made & read), fresh


def generate(
    program: Program,
    layout: Layout,
    input_names: list[str],
    output_names: list[str],
    helpers: dict[str, Any],
    new_arena: Callable[[], Any],
    env: list[Any],
    generic: Generic | None = None,
) -> Generated:
    """Generate the entry points of ``layout``. ``helpers`` binds ``_slow``, ``_failed``,
    ``_cp`` (copy an output), ``_uo`` (user_output for output k: ``_uo(v, k)``) and, for
    a generic plan, ``_adopt`` (``_adopt(key, args)``: the published instance of a new
    signature whose feeds the entry checked, or None for the slow path); ``env`` is the
    probe run's values (the baked instructions' outputs).

    ``generic``: the layout serves every signature of a shape model. The code then checks
    no shapes: the feeds' shapes are the key of an *instance* (``generic.insts``) holding
    that signature's baked values and fresh output shapes (``_i.consts``), and the arenas
    (``new_arena()``: an object with ``views``, a dict key -> views, and
    ``views_for(instance)``) are shared by every signature. ``run_checked`` and
    ``run_call`` take the instance as their last argument."""
    em = _Emitter(program, layout, env, generic)
    out_pos: dict[int, int] = {}
    for k, s in enumerate(program.output_slots):
        out_pos.setdefault(s, k)
    fast_body = em.body(lambda s: f"_empty(h{s}, d{s})")
    checked_body = em.body(
        lambda s: f"o{out_pos[s]} if o{out_pos[s]} is not None else _empty(h{s}, d{s})"
    )
    baked_slots, fresh_slots = instance_slots(program, layout)
    per_call = []
    if generic is not None:
        per_call = [f"b{s}" for s in baked_slots] + [f"h{s}" for s in fresh_slots]
    src = _Source(em, program, layout, per_call, input_names, output_names)
    fast_where = src.fast_entry(fast_body)
    checked_where = src.checked_entry("run_checked", checked_body)
    call_where = src.checked_entry("run_call", checked_body, call=True)
    src.lines.append("  return run, run_checked, run_call")

    binds = dict(em.binds)
    binds.update(helpers)
    binds.update(_ndarray=np.ndarray, _empty=np.empty, _new_arena=new_arena)
    pool: list[Any] = []
    binds.update(_pop=pool.pop, _push=pool.append)
    binds.update(_setcur=set_current, _nodes=[ins.node for ins in program.instrs])
    if generic is not None:
        binds.update(_insts=generic.insts)
    # Body lines sit inside "def run" at 4 spaces; shift everything one level under _make.
    # A small program's names are _make's parameters (closure cells: the fastest loads);
    # a long one's are the module's globals: a call with one keyword per name matches each
    # against every parameter, and cells by the thousand slow the compile, both quadratic.
    lines = src.lines
    closure = len(binds) <= MAX_CLOSURE_BINDS
    params = ", ".join(binds) if closure else ""
    text = "\n".join([lines[0].replace("__BINDS__", params)] + ["  " + ln for ln in lines[1:]])
    code = compile(text, f"<tfrt_py plan {id(layout):x}>", "exec")
    ns: dict[str, Any] = {} if closure else dict(binds)
    exec(code, ns)
    run, run_checked, run_call = ns["_make"](**binds) if closure else ns["_make"]()
    # keyed by the code object's id (the plan keeps the functions alive): hashing a code
    # object hashes all of it, which made this quadratic in the program's length
    line_node = {(id(run.__code__), ln): i for ln, i in fast_where.items()}
    line_node.update({(id(run_checked.__code__), ln): i for ln, i in checked_where.items()})
    line_node.update({(id(run_call.__code__), ln): i for ln, i in call_where.items()})
    return Generated(run, run_checked, run_call, text, line_node)
