"""The generated ``run`` cut into parts that numba types one at a time.

numba's front end (type inference, SSA, lowering to LLVM IR) grows faster than linearly
with a function's size: a Llama decode step's box (1,100 lines, 300 loops) spent 26 s of
its 34 s compile there, 8 s in LLVM. ``split_run`` moves runs of ``run``'s top-level
statements into functions of their own (``run_part<k>``, defined before ``run``, same
flags), each called from ``run`` with the names it reads from before it: the arenas,
parameters, feeds, outputs and dims. A cut goes only where nothing the part before it
assigned is read after it without being assigned again (each node's temporaries are its
own; the loop variables are assigned by their ``for``), so the parts return nothing.
The text of each part is the lines as they were, so it is a pure function of the source:
every sample of a box splits alike, and the fitted numbers stay where they were.

Load time or the compile worker; pure function of its input.
"""

from __future__ import annotations

import ast
import builtins

__all__ = ["PART_LINES", "njit_flags", "splice", "split_run"]

#: About this many lines per part (a part ends at the first allowed cut past it).
PART_LINES = 160


class _Uses(ast.NodeVisitor):
    """Names a statement reads before it writes them (in evaluation order) and every name
    it writes."""

    def __init__(self) -> None:
        self.read: set[str] = set()
        self.written: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.written.add(node.id)
        elif node.id not in self.written:
            self.read.add(node.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for t in node.targets:
            self.visit(t)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):  # read, then written
            if node.target.id not in self.written:
                self.read.add(node.target.id)
            self.written.add(node.target.id)
        else:
            self.visit(node.target)

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for s in [*node.body, *node.orelse]:
            self.visit(s)


def _uses(stmts: list[ast.stmt]) -> tuple[set[str], set[str]]:
    v = _Uses()
    for s in stmts:
        v.visit(s)
    return v.read, v.written


def split_run(source: str, part_lines: int = PART_LINES) -> str:
    """``source`` with its ``run``'s body in parts of about ``part_lines`` lines (the
    source itself when ``run`` is short or nothing can be cut)."""
    tree = ast.parse(source)
    fn = next((s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "run"),
              None)  # fmt: skip
    if fn is None or not fn.decorator_list or fn.end_lineno is None:
        return source
    body = fn.body
    if fn.end_lineno - body[0].lineno < 2 * part_lines:
        return source
    lines = source.splitlines()
    known = set(dir(builtins)) | _module_names(tree)
    # names each statement onwards reads before writing: what a cut must not leave behind
    later: list[set[str]] = [set() for _ in range(len(body) + 1)]
    for i in range(len(body) - 1, -1, -1):
        read, written = _uses([body[i]])
        later[i] = read | (later[i + 1] - written)
    parts: list[tuple[int, int]] = []  # [first, end) statement indices
    start = next((i for i, s in enumerate(body) if not _defines_prologue(s)), len(body))
    first, written = start, set()
    for i in range(start, len(body)):
        if isinstance(body[i], ast.Return):
            break
        written |= _uses([body[i]])[1]
        end_line = body[i].end_lineno or body[i].lineno
        if end_line - body[first].lineno + 1 >= part_lines and not written & later[i + 1]:
            parts.append((first, i + 1))
            first, written = i + 1, set()
    if first < len(body) and not isinstance(body[first], ast.Return):
        last = len(body) - (1 if isinstance(body[-1], ast.Return) else 0)
        if parts and last > first and not written & later[last]:
            parts.append((first, last))
    return _assemble(lines, fn, body, parts, known) if parts else source


def _defines_prologue(s: ast.stmt) -> bool:
    """A statement of the entry's prologue: it binds a name the whole function reads
    (the dims, the feeds' flat views, the arenas, the outputs), or checks a feed, or takes
    an in-place KV cache's buffer (``cache.cache_prologue``'s ``if``s, which bind ``c<i>``:
    taken for a part's statements, they left no allowed cut, since every layer and the
    return read it, and a decoder's step compiled whole: a Llama box 28 s, 17 s in parts)."""
    if isinstance(s, ast.If):  # the feeds' shape checks, the caches' take-up
        return any(isinstance(b, ast.Raise) for b in ast.walk(s))
    return isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) for t in s.targets)


def _module_names(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for s in tree.body:
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in s.names}
        elif isinstance(s, ast.Assign):
            for t in s.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.add(n.id)
        elif isinstance(s, ast.FunctionDef):
            out.add(s.name)
    return out


def _assemble(lines: list[str], fn: ast.FunctionDef, body: list[ast.stmt],
              parts: list[tuple[int, int]], known: set[str]) -> str:  # fmt: skip
    deco_line = fn.decorator_list[0].lineno - 1
    flags = njit_flags(lines[deco_line])
    defs: list[str] = []
    calls: dict[int, tuple[int, str]] = {}  # first line index -> (end line index, call)
    for k, (a, b) in enumerate(parts):
        read, _ = _uses(body[a:b])
        args = sorted(read - known)
        lo, hi = body[a].lineno - 1, (body[b - 1].end_lineno or body[b - 1].lineno)
        name = f"run_part{k}"
        defs += [f"@njit({flags}", f"def {name}({', '.join(args)}):", *lines[lo:hi], "", ""]
        calls[lo] = (hi, f"    {name}({', '.join(args)})")
    return "\n".join(splice(lines, deco_line, defs, calls))


def njit_flags(decorator: str) -> str:
    """``run``'s decorator line from its ``cache=`` flag on (a new function's, after
    ``@njit(``), without ``run``'s explicit signature."""
    return decorator[decorator.index("cache=") :] if "cache=" in decorator else "cache=True)"


def splice(lines: list[str], deco_line: int, defs: list[str],
           calls: dict[int, tuple[int, str]]) -> list[str]:  # fmt: skip
    """``lines`` with ``defs`` put before line ``deco_line`` (``run``'s decorator) and each
    span ``calls`` names (first line index -> (end line index, the call's line)) replaced
    by its call."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i == deco_line:
            out += defs
        if i in calls:
            end, call = calls[i]
            out.append(call)
            i = end
            continue
        out.append(lines[i])
        i += 1
    return out
