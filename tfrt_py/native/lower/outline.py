"""Repeated layers compiled once: the generated ``run``'s runs of statements that repeat
(a transformer's layers) become one function called once per repeat.

A model of L equal layers lowers to L copies of one layer's code that differ only in
integers (where each layer's weights sit in the packed constants, where its values sit in
the arena) and in names (each layer's cache views ``r<j>``, each node's temporaries).
numba types, lowers and optimizes each copy anew, so a 4-layer decoder step paid for its
layer four times. ``outline_repeats`` finds the run of ``run``'s top-level statements
that repeats back to back (statements equal once every integer literal and name is set
aside) and saves the most lines, checks that the copies correspond (each name of the
first copy is one name in every other copy; a name the copy reads before writing it
comes from before it, a name it writes is its own), and moves the first copy into
``run_layer<k>`` (defined before ``run``, with ``run``'s flags): its integers that differ
between copies and the names it reads become parameters, and each copy becomes a call
with its own integers and names. Nothing the copies write may be read after them (the
function returns nothing), so a copy that leaves a value behind stays inline. Up to
``MAX_OUTLINES`` such runs are moved.

The function's text is the first copy's lines with only those integers and names replaced
by parameter names of ours, so it is a pure function of the source (every sample of a box
outlines alike) and keeps ``source.py``'s rule. ``split.py`` then cuts the shorter ``run``.

Load time or the compile worker; pure function of its input.
"""

from __future__ import annotations

import ast
import builtins
import re
from typing import Any

from .split import _module_names, _uses, njit_flags, splice

__all__ = ["MAX_OUTLINES", "MIN_LINES", "outline_repeats"]

#: A repeated run is moved only when each copy spans at least this many lines.
MIN_LINES = 40
#: At most this many repeated runs are moved.
MAX_OUTLINES = 4


def _shape_key(stmt: ast.stmt) -> str:
    """The statement with every integer literal and name set aside."""
    return _SET_ASIDE.sub(r"\1", ast.dump(stmt))


#: In ``ast.dump``'s text: a name's identifier, an integer literal's digits (a float has a
#: point, a bool is a word, a negative number is a unary minus around its digits).
_SET_ASIDE = re.compile(r"(Name\(id=)'[^']*'|(?<=Constant\(value=)\d+(?=\))")


def _lines(body: list[ast.stmt], a: int, b: int) -> int:
    return (body[b - 1].end_lineno or body[b - 1].lineno) - body[a].lineno + 1


def _best_run(body: list[ast.stmt], keys: list[str]) -> tuple[int, int, int] | None:
    """(first statement, statements per copy, copies) of the repeated run that saves the
    most lines, None when none spans ``MIN_LINES`` a copy."""
    n, best, best_saved = len(keys), None, 0
    for size in range(1, n // 2 + 1):
        a = 0
        while a + 2 * size <= n:
            if keys[a] != keys[a + size] or _lines(body, a, a + size) < MIN_LINES:
                a += 1
                continue
            copies = 1
            while keys[a + copies * size : a + (copies + 1) * size] == keys[a : a + size]:
                copies += 1
            if copies >= 2:
                saved = (copies - 1) * _lines(body, a, a + size)
                if saved > best_saved:
                    best, best_saved = (a, size, copies), saved
                a += copies * size
            else:
                a += 1
    return best


def _leaves(stmts: list[ast.stmt]) -> list[ast.AST]:
    """The names and integer literals of ``stmts``, in one fixed order."""
    return [n for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name) or _is_int(n)]


def _is_int(n: ast.AST) -> bool:
    return isinstance(n, ast.Constant) and type(n.value) is int


def outline_repeats(source: str) -> str:
    """``source`` with up to ``MAX_OUTLINES`` repeated runs of ``run``'s statements moved
    into functions of their own (``source`` itself when none repeats)."""
    for k in range(MAX_OUTLINES):
        moved = _outline_once(source, f"run_layer{k}")
        if moved is None:
            break
        source = moved
    return source


def _outline_once(source: str, name: str) -> str | None:
    """``source`` with its best repeated run moved into the function ``name``; None when
    there is none, or its copies do not qualify (the module docstring's rules)."""
    tree = ast.parse(source)
    fn = next((s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "run"),
              None)  # fmt: skip
    if fn is None or not fn.decorator_list:
        return None
    body = fn.body
    keys = [_shape_key(s) for s in body]
    best = _best_run(body, keys)
    if best is None:
        return None
    a, size, copies = best
    blocks = [body[a + i * size : a + (i + 1) * size] for i in range(copies)]
    # names each statement onwards reads before writing: what a copy must not leave behind
    later: set[str] = _uses(body[a + copies * size :])[0]
    uses = [_uses(b) for b in blocks]
    if any(written & later for _, written in uses) or any(
        uses[i][1] & _uses(body[a + (i + 1) * size :])[0] for i in range(copies - 1)
    ):
        return None
    known = set(dir(builtins)) | _module_names(tree)
    leaves = [_leaves(b) for b in blocks]
    if len({len(x) for x in leaves}) != 1:
        return None
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        arg.arg for arg in fn.args.args
    }
    params: list[str] = []  # the function's parameters, in order
    args: list[list[str]] = [[] for _ in range(copies)]  # each call's arguments
    replace: dict[int, str] = {}  # leaf index of the first copy -> parameter name
    names: list[dict[str, str]] = [{} for _ in range(copies)]  # first copy's name -> copy i's
    by_names: dict[tuple[str, ...], str] = {}
    by_values: dict[tuple[int, ...], str] = {}

    def fresh() -> str:
        p = f"lp{len(params)}"
        while p in taken:
            p += "_"
        return p

    for j, nodes in enumerate(zip(*leaves)):
        first = nodes[0]
        if isinstance(first, ast.Constant):
            values = tuple(int(n.value) for n in nodes)
            if len(set(values)) > 1:
                if values not in by_values:
                    by_values[values] = p = fresh()
                    params.append(p)
                    for i, v in enumerate(values):
                        args[i].append(f"np.int64({v})")
                replace[j] = by_values[values]
            continue
        ids = tuple(n.id for n in nodes)
        if any(x in known for x in ids):  # a global: the module's (np, f4, a kernel)
            if len(set(ids)) > 1 or any(ids[0] in written for _, written in uses):
                return None
            continue
        for i, other in enumerate(ids):
            if names[i].setdefault(ids[0], other) != other:
                return None  # one name of the first copy is two names of another
        free = [ids[i] in uses[i][0] for i in range(copies)]
        if any(free) and not all(free):
            return None
        if not free[0]:
            continue  # the copy's own temporary: the first copy's name serves
        if ids not in by_names:
            by_names[ids] = p = ids[0] if len(set(ids)) == 1 else fresh()
            params.append(p)
            for i, other in enumerate(ids):
                args[i].append(other)
        if by_names[ids] != ids[0]:
            replace[j] = by_names[ids]
    for m in names[1:]:  # the correspondence is one to one
        if len(set(m.values())) != len(m):
            return None
    return _assemble(source, fn, blocks, leaves[0], replace, name, params, args)


def _assemble(source: str, fn: ast.FunctionDef, blocks: list[list[ast.stmt]],
              leaves: list[ast.AST], replace: dict[int, str], name: str,
              params: list[str], args: list[list[str]]) -> str:  # fmt: skip
    lines = source.splitlines()
    first = blocks[0]
    lo, hi = first[0].lineno - 1, first[-1].end_lineno or first[-1].lineno
    own = lines[lo:hi]
    edits: dict[int, list[tuple[int, int, str]]] = {}
    for j, p in replace.items():
        n: Any = leaves[j]
        edits.setdefault(n.lineno - 1 - lo, []).append((n.col_offset, n.end_col_offset, p))
    for row, cuts in edits.items():
        text = own[row]
        for c0, c1, p in sorted(cuts, reverse=True):
            text = text[:c0] + p + text[c1:]
        own[row] = text
    deco_line = fn.decorator_list[0].lineno - 1
    flags = njit_flags(lines[deco_line])
    define = [f"@njit({flags}", f"def {name}({', '.join(params)}):", *own, "", ""]
    calls = {}
    for i, block in enumerate(blocks):
        b0, b1 = block[0].lineno - 1, block[-1].end_lineno or block[-1].lineno
        calls[b0] = (b1, f"    {name}({', '.join(args[i])})")
    out = splice(lines, deco_line, define, calls)
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")
