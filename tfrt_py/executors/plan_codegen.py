"""Generate the straight-line Python function that runs one planned signature.

The generated source defines ``_make(...)``, whose parameters are everything the code
uses (kernels ``k<i>``, constants ``c<slot>``, expected dtypes and shapes, input and
output names ``_n<j>``/``_o<k>``, helpers), and which returns two closures over them. The
source holds no model text: names are bound as closure constants (``feeds[_n0]`` costs
what ``feeds['x']`` does), never pasted in. The closures:

* ``run(feeds, outs=None)``: the fast path. Checks in line that ``feeds`` has exactly this
  signature (``type(x) is ndarray``, ``x.dtype is d``, ``x.shape == h``), else hands the
  call to ``_slow``; takes an arena from the free list; calls each kernel in program order
  with ``out=`` its arena view; returns the outputs dict.
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

A compute function may carry ``inline(in_shapes, out_shape, dtype) -> Inline | None``:
statements that compute its output into ``{out}`` from ``{in0}``, ``{in1}``, ... using the
names in ``Inline.env``. The generator pastes them in place of the call (the fused kernels
in ``compiler/fused_kernels.py`` do this), saving the Python frame of the kernel call. The
statements are the kernel's own fixed text: every value they use (attributes such as
alpha included) reaches them through ``env``, which the generator binds under names of
its own (``i<node>_<j>``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..calls import set_current
from .plan_build import Layout
from .program import Program

__all__ = ["Generated", "Inline", "generate"]


@dataclass(frozen=True)
class Inline:
    """Statements replacing a kernel call; ``{out}``/``{inN}`` are placeholders, ``env``
    names what the statements use."""

    lines: list[str]
    env: dict[str, Any]


@dataclass
class Generated:
    """The generated entry points and what maps a failing line back to its node."""

    run: Callable[..., Any]
    run_checked: Callable[..., Any]
    run_call: Callable[..., Any]
    source: str
    line_node: dict[tuple[Any, int], int]  # (code object, line) -> instruction index


_KEYWORD_OUT_UFUNCS = (np.maximum, np.minimum)


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
    def __init__(self, program: Program, layout: Layout, env: list[Any]) -> None:
        self.program = program
        self.layout = layout
        self.binds: dict[str, Any] = {}
        #: slot -> the constant it holds: the model's, and this signature's (baked)
        self.consts: dict[int, Any] = {
            s: t for s, t in enumerate(program.template) if t is not None and s > 1
        }
        for i in layout.baked:
            for s in program.instrs[i].outs:
                if s > 1:
                    self.consts[s] = env[s]
        self.input_slots = set(program.input_slots)

    def var(self, s: int) -> str:
        if s == 0:
            return "None"
        if s == 1:
            return "_"
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
                    self.binds[f"h{s}"], self.binds[f"d{s}"] = shape, dtype
                    lines.append((f"{out} = {fresh_src(s)}", i))
                lines += [(ln, i) for ln in self._call(i, ins.fn, k, args, out, s)]
            for r in lay.release.get(i, ()):
                lines.append((f"del {self.var(r)}", i))
        return lines

    def _call(self, i: int, fn: Any, k: str, args: list[str], out: str, s: int) -> list[str]:
        inline = getattr(fn, "inline", None)
        if inline is not None:
            seen = self.layout.observed
            shapes = [seen[x][0] if x in seen else None for x in self.program.instrs[i].ins]
            got = inline(shapes, self.layout.shapes[s][0], self.layout.shapes[s][1])
            if got is not None:
                names = {key: f"i{i}_{j}" for j, key in enumerate(got.env)}
                for key, val in got.env.items():
                    self.binds[names[key]] = val
                fields = {f"in{j}": a for j, a in enumerate(args)} | {"out": out} | names
                return [ln.format(**fields) for ln in got.lines]
        if _out_positional(fn, len(args)):
            return [f"{out} = {k}({', '.join([*args, out])})"]
        return [f"{out} = {k}({', '.join([*args, f'out={out}'])})"]


def generate(
    program: Program,
    layout: Layout,
    input_names: list[str],
    output_names: list[str],
    helpers: dict[str, Any],
    new_arena: Callable[[], tuple[Any, ...]],
    env: list[Any],
) -> Generated:
    """Generate the entry points of ``layout``. ``helpers`` binds ``_slow``, ``_failed``,
    ``_cp`` (copy an output), ``_uo`` (user_output for output k: ``_uo(v, k)``); ``env``
    is the probe run's values (the baked instructions' outputs)."""
    em = _Emitter(program, layout, env)
    pool: list[Any] = []
    sig = layout.plan.signature
    in_slots = program.input_slots
    arena_vars = [f"v{s}" for s, *_ in layout.views]
    out_pos: dict[int, int] = {}
    for k, s in enumerate(program.output_slots):
        out_pos.setdefault(s, k)

    fast_body = em.body(lambda s: f"_empty(h{s}, d{s})")
    checked_body = em.body(
        lambda s: f"o{out_pos[s]} if o{out_pos[s]} is not None else _empty(h{s}, d{s})"
    )

    src: list[str] = ["def _make(" + "__BINDS__" + "):"]

    def emit_body(
        fn_name: str, body: list[tuple[str, int]], where: dict[int, int], call: bool = False
    ) -> None:
        """The body of an entry; ``call``: it runs under a CallContext ``_c`` (current on
        this thread meanwhile) whose ``stop`` is checked before each kernel."""
        if arena_vars:
            src.extend([
                "    try:", "        _arena = _pop()", "    except IndexError:",
                "        _arena = _new_arena()",
                f"    {', '.join(arena_vars)}{',' if len(arena_vars) == 1 else ''} = _arena",
            ])  # fmt: skip
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
        if arena_vars:
            src.append("        _push(_arena)")
        src.append(f"        raise _failed(_e, {fn_name!r})")
        if call:
            src.append("    _setcur(_prev)")
        if arena_vars:
            src.append("    _push(_arena)")

    # -- fast entry --------------------------------------------------------------------
    n_in = len(input_names)
    fast_where: dict[int, int] = {}
    src.append("  def run(feeds, outs=None):")
    src.append("    if outs is not None:")
    src.append("        return _slow(feeds, outs)")
    src.append("    try:")
    src.append(f"        if len(feeds) != {n_in}:")
    src.append("            return _slow(feeds, outs)")
    for j, (name, s) in enumerate(zip(input_names, in_slots)):
        em.binds[f"_n{j}"] = name  # names are model text: bound, never pasted
        src.append(f"        v{s} = feeds[_n{j}]")
    src.append("    except Exception:")
    src.append("        return _slow(feeds, outs)")
    if n_in:
        conds = []
        for (shape, dtype), s in zip(sig, in_slots):
            em.binds[f"h{s}"], em.binds[f"d{s}"] = tuple(shape), dtype
            conds.append(
                f"type(v{s}) is not _ndarray or v{s}.dtype is not d{s} or v{s}.shape != h{s}"
            )
        src.append(f"    if {' or '.join(conds)}:")
        src.append("        return _slow(feeds, outs)")
    emit_body("run", [(ln, i) for ln, i in fast_body], fast_where)
    results = []
    for k, (s, kind) in enumerate(zip(program.output_slots, layout.output_kinds)):
        v = em.var(s)
        results.append(
            v if kind == "fresh" else f"_cp({v}, {k})" if kind == "copy" else f"_uo({v}, {k})"
        )
    for k, name in enumerate(output_names):
        em.binds[f"_o{k}"] = name
    pairs = ", ".join(f"_o{k}: {r}" for k, r in enumerate(results))
    src.append(f"    return {{{pairs}}}")
    # -- checked entry -----------------------------------------------------------------
    checked_where: dict[int, int] = {}
    src.append("  def run_checked(args, outs):")
    if n_in:
        src.append(f"    {', '.join(f'v{s}' for s in in_slots)}, = args")
    n_out = len(output_names)
    src.append(f"    {', '.join(f'o{k}' for k in range(n_out))}, = outs")
    emit_body("run_checked", checked_body, checked_where)
    src.append(f"    return [{', '.join(em.var(s) for s in program.output_slots)}]")
    # -- the checked entry under a call context (deadline, cancellation) -----------------
    call_where: dict[int, int] = {}
    src.append("  def run_call(args, outs, _c):")
    if n_in:
        src.append(f"    {', '.join(f'v{s}' for s in in_slots)}, = args")
    src.append(f"    {', '.join(f'o{k}' for k in range(n_out))}, = outs")
    emit_body("run_call", checked_body, call_where, call=True)
    src.append(f"    return [{', '.join(em.var(s) for s in program.output_slots)}]")
    src.append("  return run, run_checked, run_call")

    binds = dict(em.binds)
    binds.update(helpers)
    binds.update(_ndarray=np.ndarray, _empty=np.empty, _new_arena=new_arena)
    binds.update(_pop=pool.pop, _push=pool.append)
    binds.update(_setcur=set_current, _nodes=[ins.node for ins in program.instrs])
    # Body lines sit inside "def run" at 4 spaces; shift everything one level under _make.
    text = "\n".join(
        [src[0].replace("__BINDS__", ", ".join(binds))] + ["  " + ln for ln in src[1:]]
    )
    code = compile(text, f"<tfrt_py plan {id(layout):x}>", "exec")
    ns: dict[str, Any] = {}
    exec(code, ns)
    run, run_checked, run_call = ns["_make"](**binds)
    line_node = {(run.__code__, ln): i for ln, i in fast_where.items()}
    line_node.update({(run_checked.__code__, ln): i for ln, i in checked_where.items()})
    line_node.update({(run_call.__code__, ln): i for ln, i in call_where.items()})
    return Generated(run, run_checked, run_call, text, line_node)
