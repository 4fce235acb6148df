"""``--param-sample N`` (tests/support/param_sample.py): CI's extra legs run each
parametrized test at most N times, first and last case kept, the same choice everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.param_sample import sample_indices

ROOT = Path(__file__).resolve().parents[1]


def test_sample_indices_keep_the_ends_evenly_spaced() -> None:
    assert sample_indices(3, 5) == [0, 1, 2]
    assert sample_indices(10, 1) == [0]
    assert sample_indices(10, 2) == [0, 9]
    assert sample_indices(9, 3) == [0, 4, 8]
    assert sample_indices(1000, 4) == [0, 333, 666, 999]
    with pytest.raises(ValueError):
        sample_indices(3, 0)


def _run(tmp_path: Path, *options: str) -> tuple[list[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.param_sample", "-q", "-s",
         "-p", "no:cacheprovider", *options, str(tmp_path / "test_grid.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = (line.lstrip(".") for line in out.stdout.splitlines())
    return sorted(line for line in lines if line.startswith("ran")), out.stdout + out.stderr


def test_the_sample_and_the_rest_run_every_case_once(tmp_path: Path) -> None:
    """``--param-sample 3`` keeps 3 of 7 cases and the unparametrized test;
    ``--param-rest 3`` runs the other 4 and nothing else; together every case once."""
    (tmp_path / "test_grid.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('i', range(7))\n"
        "def test_grid(i):\n    print('ran', i)\n"
        "def test_plain():\n    print('ran plain')\n"
    )
    sample, log = _run(tmp_path, "--param-sample", "3")
    assert sample == ["ran 0", "ran 3", "ran 6", "ran plain"], log
    assert "4 passed, 4 deselected" in log, log
    rest, log = _run(tmp_path, "--param-rest", "3")
    assert rest == ["ran 1", "ran 2", "ran 4", "ran 5"], log
    assert "4 passed, 4 deselected" in log, log
    _, log = _run(tmp_path, "--param-rest", "3", "--param-sample", "3")
    assert "exclude each other" in log, log


def test_the_file_sample_keeps_n_tests_of_a_file(tmp_path: Path) -> None:
    """``--file-sample 2`` after ``--param-sample 3``: the file's first and last test of
    the four the sample kept."""
    (tmp_path / "test_grid.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('i', range(7))\n"
        "def test_grid(i):\n    print('ran', i)\n"
        "def test_plain():\n    print('ran plain')\n"
    )
    ran, log = _run(tmp_path, "--param-sample", "3", "--file-sample", "2")
    assert ran == ["ran 0", "ran plain"], log
    assert "2 passed, 6 deselected" in log, log
