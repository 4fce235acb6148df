"""The index of which ops each built-in kernel module serves, generated from the families.

``tfrt_py/kernels/module_ops.py`` lets the default registry import a kernel module only
when one of its ops is first looked up. It must list exactly what each module's
``register_kernels`` registers (every
module of every family): ``test_kernels_layout.py`` regenerates it and fails when the file
differs (a kernel added, renamed or moved to another module).

``python -m tests.architecture.module_ops --write`` rewrites the index.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

import tfrt_py.kernels as kernels_pkg
from tfrt_py.kernels.families import FAMILIES
from tfrt_py.kernels.registry import KernelRegistry

INDEX = Path(kernels_pkg.__file__).parent / "module_ops.py"

_HEADER = '''"""Which (domain, op type) pairs each built-in kernel module registers.

Keyed by the module's path under ``tfrt_py.kernels`` (family first: ``nn.conv``), in the
order of ``families.FAMILIES``. Generated from the families by
``python -m tests.architecture.module_ops --write``; a test regenerates it and fails when
it differs. ``families.default_registry()`` uses it to import a kernel module only when
one of its ops is first looked up.
"""

from __future__ import annotations

__all__ = ["MODULE_OPS"]

MODULE_OPS: dict[str, tuple[tuple[str, str], ...]] = {
'''


def module_ops() -> dict[str, list[tuple[str, str]]]:
    """Each kernel module's ops (``family.module`` -> what its ``register_kernels``
    registers, sorted), family by family in ``FAMILIES`` order, modules by name."""
    found: dict[str, list[tuple[str, str]]] = {}
    for family in FAMILIES:
        pkg = importlib.import_module(f"tfrt_py.kernels.{family}")
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
            module = importlib.import_module(f"{pkg.__name__}.{info.name}")
            if hasattr(module, "register_kernels"):
                reg = KernelRegistry()
                module.register_kernels(reg)
                found[f"{family}.{info.name}"] = reg.ops()
    return found


def render() -> str:
    lines = [_HEADER]
    for module, ops in module_ops().items():
        one = f'    "{module}": (("{ops[0][0]}", "{ops[0][1]}"),),\n' if len(ops) == 1 else ""
        if one and len(one) <= 101:  # as ruff format writes it
            lines.append(one)
            continue
        lines.append(f'    "{module}": (\n')
        lines.extend(f'        ("{d}", "{op}"),\n' for d, op in ops)
        lines.append("    ),\n")
    lines.append("}\n")
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the index file")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        INDEX.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
