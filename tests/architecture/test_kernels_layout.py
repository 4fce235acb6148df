"""The kernels package's layout rules: family subpackages registered in one list, no import
cycles, and kernels import nothing above them (errors, ir, calls and concurrency only: the
intra-op pool). That no family imports another (but ``fused``, which composes them) and
the compute library ``lib`` imports no family is ``INNER_LAYERS["kernels"]``, checked by
``test_layers.py``."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import tfrt_py.kernels as kernels_pkg
from tests.architecture import module_ops
from tfrt_py.kernels import KernelRegistry, default_registry
from tfrt_py.kernels.families import FAMILIES

_ROOT = Path(kernels_pkg.__file__).parent
#: The compute library (``kernels/lib``): shared by the families, itself no family.
_LIB = "lib"
_FAMILIES = sorted(m.name for m in pkgutil.iter_modules([str(_ROOT)]) if m.ispkg and m.name != _LIB)
#: What kernels may import from tfrt_py besides themselves.
_BELOW = {"tfrt_py.errors", "tfrt_py.records", "tfrt_py.ir", "tfrt_py.calls", "tfrt_py.concurrency"}


def _module_name(path: Path) -> str:
    parts = ["tfrt_py", "kernels", *path.relative_to(_ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_MODULES = {_module_name(p): p for p in _ROOT.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """Every tfrt_py module ``name`` imports, at any depth of its body (functions and
    ``TYPE_CHECKING`` blocks included), relative imports resolved."""
    path = _MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in _MODULES else base)
    return {m for m in found if m.startswith("tfrt_py")}


def test_no_import_cycles_in_kernels() -> None:
    graph = {m: {i for i in _imports(m) if i in _MODULES and i != m} for m in _MODULES}
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = [*path[path.index(n) :], n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_kernels_import_nothing_above_them() -> None:
    bad = {
        (m, i)
        for m in _MODULES
        for i in _imports(m)
        if not i.startswith("tfrt_py.kernels") and not any(i.startswith(b) for b in _BELOW)
    }
    assert not bad, sorted(bad)


#: The one family that composes others (the compiler's fused ops run other families'
#: compute cores); no family imports it.
def test_default_registry_is_the_union_of_the_families() -> None:
    assert _FAMILIES == [
        "contrib",
        "control",
        "elementwise",
        "fused",
        "image",
        "indexing",
        "linalg",
        "misc",
        "ml",
        "nn",
        "reduce",
        "shape",
    ]
    union: set[tuple[str, str]] = set()
    for family in _FAMILIES:
        reg = KernelRegistry()
        importlib.import_module(f"tfrt_py.kernels.{family}").register_kernels(reg)
        ops = set(reg.ops())
        assert ops, family
        assert not ops & union, f"{family} registers ops another family has"
        union |= ops
    assert union == set(default_registry().ops())


def test_the_lazy_index_lists_what_each_kernel_module_registers() -> None:
    """``kernels/module_ops.py`` (the default registry imports a module when one of its
    ops is first looked up) is what the modules register today; a kernel added without
    regenerating it would never be found."""
    assert module_ops.render() == module_ops.INDEX.read_text(encoding="utf-8"), (
        "kernels/module_ops.py is stale: python -m tests.architecture.module_ops --write"
    )
    assert set(FAMILIES) == set(_FAMILIES)


@pytest.mark.parametrize("family", _FAMILIES)
def test_family_registers_every_module(family: str) -> None:
    """Each module with kernels is in its family's list: registering the modules one by
    one gives exactly what the family's ``register_kernels`` gives."""
    pkg = importlib.import_module(f"tfrt_py.kernels.{family}")
    whole = KernelRegistry()
    pkg.register_kernels(whole)
    parts = KernelRegistry()
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        if hasattr(mod, "register_kernels"):
            mod.register_kernels(parts)
    assert parts.ops() == whole.ops()
