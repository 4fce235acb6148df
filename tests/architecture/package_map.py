"""The package map of ``docs/architecture.md``, generated from the code.

One row per package (every directory with an ``__init__.py``) and per top-level module:
its layer (``stack.LAYERS``), its lines of Python to the hundred (subpackages included),
and the first sentence of its docstring. The map stands in
``docs/architecture.md`` between the ``package-map`` markers; ``test_package_map.py``
regenerates it and fails when the file differs (a package added, a docstring changed, a
file grown), so the map cannot drift from the code.

``python -m tests.architecture.package_map --write`` rewrites the map in the docs;
``--budget`` prints each top-level package's lines against its budget (``make lint``).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import tfrt_py
from tests.architecture.stack import LAYERS, LINE_BUDGET, MODULE_BUDGET

ROOT = Path(tfrt_py.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"
BEGIN = "<!-- package-map:begin (generated: python -m tests.architecture.package_map --write) -->"
END = "<!-- package-map:end -->"


def layer_of(top: str) -> int:
    """The layer of top-level package or module ``top`` ("tfrt_py" for the root)."""
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise KeyError(f"tfrt_py.{top} is in no layer of stack.LAYERS")


def _lines(path: Path) -> int:
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)


def _summary(path: Path) -> str:
    """The first sentence of the module's docstring (its first paragraph, joined), "" when
    it has none."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    para = " ".join(doc.split("\n\n", 1)[0].split())
    end = para.find(". ")
    return para if end < 0 else para[: end + 1]


def rows() -> list[tuple[int, str, int, int, str]]:
    """``(layer, package, lines, budget, summary)``, by layer then name."""
    found = []
    for init in sorted(ROOT.rglob("__init__.py")):
        pkg = init.parent
        rel = pkg.relative_to(ROOT)
        top = rel.parts[0] if rel.parts else "tfrt_py"
        name = "tfrt_py/" + "/".join(rel.parts) + ("/" if rel.parts else "")
        lines = _lines(pkg) if rel.parts else _lines(init)
        budget = LINE_BUDGET.get(top, MODULE_BUDGET) if len(rel.parts) == 1 else 0
        found.append((layer_of(top), name, lines, budget, _summary(init)))
    for mod in sorted(ROOT.glob("*.py")):
        if mod.name != "__init__.py":
            name = f"tfrt_py/{mod.name}"
            found.append((layer_of(mod.stem), name, _lines(mod), MODULE_BUDGET, _summary(mod)))
    return sorted(found, key=lambda r: (r[0], r[1]))


def table() -> str:
    """The map as a Markdown table between its markers."""
    out = [BEGIN, "", "| layer | package | lines | what it is |", "|---|---|---|---|"]
    for layer, name, lines, _, summary in rows():
        text = summary.replace("|", "\\|")
        out.append(f"| {layer} | `{name}` | {_rounded(lines)} | {text} |")
    return "\n".join([*out, "", END])


def _rounded(lines: int) -> str:
    """Lines to the hundred (at least 100), so the map changes when a package grows, not
    with every edit."""
    return f"{max(100, round(lines, -2)):,}"


def current_doc_table() -> str:
    text = DOC.read_text(encoding="utf-8")
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    return text[start:stop]


def write() -> None:
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(text.replace(current_doc_table(), table()), encoding="utf-8")


def over_budget() -> list[str]:
    """The top-level packages and modules over their line budget."""
    return [f"{n}: {lines} lines > {b}" for _, n, lines, b, _ in rows() if b and lines > b]


def print_budget() -> None:
    print(f"{'package':<28} {'lines':>6} {'budget':>7}")
    for _, name, lines, budget, _ in rows():
        if budget:
            flag = "  OVER" if lines > budget else ""
            print(f"{name:<28} {lines:>6} {budget:>7}{flag}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--write", action="store_true", help="rewrite the map in the docs")
    ap.add_argument("--budget", action="store_true", help="print lines against budgets")
    args = ap.parse_args(argv)
    if args.write:
        write()
    if args.budget:
        print_budget()
    if not (args.write or args.budget):
        print(table())
    return 1 if over_budget() else 0


if __name__ == "__main__":
    sys.exit(main())
