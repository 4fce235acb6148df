"""Packaging that tells the truth (issue 13): the floors CI installs are the floors
pyproject.toml declares, and the base install works without the optional extras, saying
what is missing when an extra's feature is asked for."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _floors(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^]]*\])?>=([0-9][^,;\s]*)", spec)
        if m:
            out[m.group(1).lower().replace("-", "_")] = m.group(3)
    return out


def test_floor_pins_are_the_declared_floors() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _floors(project["dependencies"] + project["optional-dependencies"]["native"])
    pins = {}
    for line in (ROOT / ".ci" / "floor.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("-", "_")] = version
    assert set(pins) == set(declared), (pins, declared)
    for name, floor in declared.items():
        assert pins[name].startswith(floor), f"{name}: pinned {pins[name]}, declared >={floor}"


def test_requires_python_matches_the_tools() -> None:
    toml = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floor = toml["project"]["requires-python"].removeprefix(">=")
    assert toml["tool"]["mypy"]["python_version"] == floor
    assert toml["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")


_WITHOUT_EXTRAS = textwrap.dedent(
    """
    import importlib.abc, sys

    class Missing(importlib.abc.MetaPathFinder):
        # the optional extras, as if not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"numba", "starlette", "uvicorn", "httptools"}:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    import numpy as np
    import tfrt_py
    from tfrt_py.ir import GraphBuilder

    b = GraphBuilder("g")
    x = b.input("x", np.float32, (1, 4))
    b.output(b.op("Relu", x), "y")
    model = tfrt_py.load(b.build())
    assert model.executor == "sync", model.executor
    assert model.run({"x": -np.ones((1, 4), np.float32)})["y"].sum() == 0
    assert "tfrt-py[native]" in model.describe(), model.describe()
    try:
        tfrt_py.load(b.build(), executor="native")
    except tfrt_py.errors.TfrtError as e:
        assert "tfrt-py[native]" in str(e), e
    else:
        raise AssertionError("native without numba loaded")
    try:
        import tfrt_py.serving
    except ImportError as e:
        assert "tfrt-py[serve]" in str(e), e
    else:
        raise AssertionError("tfrt_py.serving imported without starlette")
    print("ok")
    """
)


def test_the_base_install_works_without_the_extras() -> None:
    env = {"TFRT_PY_NATIVE": "1"}
    import os

    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_every_data_file_in_the_package_is_shipped() -> None:
    """A file the package reads at run time (the native pool's IR, the bundled models) is
    in a wheel only when ``package-data`` names it: every tracked non-Python file under
    ``tfrt_py/`` must match one of its globs."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["tfrt_py"]
    tracked = subprocess.run(
        ["git", "ls-files", "tfrt_py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    data = [Path(f).relative_to("tfrt_py") for f in tracked if not f.endswith(".py")]
    assert any(str(p).endswith(".ll") for p in data)
    unshipped = [str(p) for p in data if not any(p.match(g) for g in globs)]
    assert unshipped == []
