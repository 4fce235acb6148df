"""The package map in ``docs/architecture.md`` is the one the code generates, and every
package stays within its line budget (``package_map.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture import package_map


def test_the_docs_hold_the_generated_package_map() -> None:
    assert package_map.current_doc_table() == package_map.table(), (
        "docs/architecture.md's package map is stale: "
        "run `python -m tests.architecture.package_map --write`"
    )


def test_every_package_states_what_it_is() -> None:
    missing = [name for _, name, _, _, summary in package_map.rows() if not summary]
    assert not missing, f"packages without a docstring: {missing}"


def test_every_package_is_within_its_line_budget() -> None:
    assert not package_map.over_budget()


def test_a_new_package_changes_the_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check bites: a package added under the root shows up as a new row."""
    root = tmp_path / "tfrt_py"
    (root / "kernels" / "newfamily").mkdir(parents=True)
    (root / "__init__.py").write_text('"""The root."""\n')
    (root / "kernels" / "__init__.py").write_text('"""Kernels."""\n')
    monkeypatch.setattr(package_map, "ROOT", root)
    without = package_map.table()
    (root / "kernels" / "newfamily" / "__init__.py").write_text('"""A new family. More."""\n')
    with_it = package_map.table()
    assert without != with_it
    assert "| 3 | `tfrt_py/kernels/newfamily/` | 100 | A new family. |" in with_it
