"""The import graph of tfrt_py, derived with ``ast``: no cycles between modules, and every
import points down the documented layer stack (docs/architecture.md).

Every import counts: module level, inside functions (lazy imports) and under
``TYPE_CHECKING``, because each is a dependency a reader has to hold in mind.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict

import pytest

import tfrt_py
from tests.architecture.stack import INNER_LAYERS, LAYERS, OTHERS

ROOT = os.path.dirname(tfrt_py.__file__)


def _modules() -> dict[str, str]:
    mods = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                mods[rel.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, str]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    targets.append(full if full in mods else target)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != mod:
                    edges[mod].add(t)
    return edges


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "tfrt_py"


def _layer(top: str) -> int:
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"tfrt_py.{top} is in no layer of LAYERS: add it (and to the docs)")


def _cycles(edges: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_cycles_between_modules() -> None:
    mods = _modules()
    cycles = _cycles(_imports(mods), sorted(mods))
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_imports_follow_the_layer_stack() -> None:
    mods = _modules()
    bad = []
    for mod, targets in sorted(_imports(mods).items()):
        src = _top(mod)
        for t in sorted(targets):
            dst = _top(t)
            if dst != src and _layer(dst) >= _layer(src):
                bad.append(f"{mod} imports {t} (layer {_layer(src)} -> {_layer(dst)})")
    assert not bad, "imports against the layer stack:\n" + "\n".join(bad)


def test_every_package_has_a_layer() -> None:
    for mod in _modules():
        _layer(_top(mod))


def _part(mod: str, package: str) -> str | None:
    """The part of ``package`` (a direct module or subpackage) ``mod`` is in; None for the
    package's ``__init__`` and for modules of other packages."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == package else None


def _inner_layer(package: str, part: str) -> int:
    stack = INNER_LAYERS[package]
    for i, layer in enumerate(stack):
        if part in layer:
            return i
    for i, layer in enumerate(stack):
        if OTHERS in layer:
            return i
    raise AssertionError(
        f"tfrt_py.{package}.{part} is in no layer of INNER_LAYERS[{package!r}] "
        "(tests/architecture/stack.py): place it"
    )


def _inner_violations(edges: dict[str, set[str]], package: str) -> list[str]:
    bad = []
    for mod, targets in sorted(edges.items()):
        src = _part(mod, package)
        for t in sorted(targets):
            dst = _part(t, package)
            if src is None or dst is None or dst == src:
                continue
            ls, ld = _inner_layer(package, src), _inner_layer(package, dst)
            if ld >= ls:
                bad.append(f"{mod} imports {t} ({package} layer {ls} -> {ld})")
    return bad


@pytest.mark.parametrize("package", sorted(INNER_LAYERS))
def test_imports_inside_a_package_follow_its_stack(package: str) -> None:
    bad = _inner_violations(_imports(_modules()), package)
    assert not bad, "imports against the package's stack:\n" + "\n".join(bad)


def test_every_part_of_a_stacked_package_has_a_layer() -> None:
    for mod in _modules():
        package = _top(mod)
        part = _part(mod, package)
        if package in INNER_LAYERS and part is not None:
            _inner_layer(package, part)


def test_the_inner_check_finds_an_upward_and_a_sideways_import() -> None:
    edges = {
        "tfrt_py.executors.program": {"tfrt_py.executors.interpreter"},
        "tfrt_py.executors.plan_build": {"tfrt_py.executors.dataflow_schedule"},
        "tfrt_py.executors.interpreter": {"tfrt_py.executors.program"},
    }
    bad = _inner_violations(edges, "executors")
    assert [b.split(" imports")[0].rsplit(".", 1)[1] for b in bad] == ["plan_build", "program"]


def test_the_checker_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges, ["a", "b", "c", "d"]) == [["a", "b", "c"]]
