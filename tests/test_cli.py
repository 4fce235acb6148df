"""The tfrt-py command, run through its installed entry point, and the bench method."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfrt_py.bench import measure
from tfrt_py.bench.report import COLUMNS, markdown_table
from tfrt_py.bench.runners import check_agreement

EXAMPLES = Path(__file__).resolve().parents[1] / "tfrt_py" / "examples"
MLP = str(EXAMPLES / "mlp_small.onnx")
ADS = str(EXAMPLES / "ads_normalize.onnx")
TFRT_PY = os.path.join(os.path.dirname(sys.executable), "tfrt-py")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TFRT_PY, *args], capture_output=True, text=True, timeout=120)


def test_run_prints_outputs_with_random_inputs() -> None:
    r = cli("run", MLP)
    assert r.returncode == 0, r.stderr
    assert "probs float32[1, 10]" in r.stdout


def test_run_with_npy_input(tmp_path: Path) -> None:
    x = np.zeros((1, 64), np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("run", MLP, "--input", f"x={tmp_path / 'x.npy'}")
    assert r.returncode == 0, r.stderr


def test_inspect_shows_io_ops_and_executor() -> None:
    r = cli("inspect", ADS)
    assert r.returncode == 0, r.stderr
    assert "f0: float32[1,1]" in r.stdout
    assert "Div x18" in r.stdout
    assert "executor:" in r.stdout


def test_bench_writes_json_with_every_runtime(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    r = cli("bench", MLP, "--seconds", "0.3", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    names = {row["name"] for row in data["results"]}
    assert names == {"tfrt_py[sync]", "onnxruntime run", "onnxruntime io binding"}
    for row in data["results"]:
        assert row["median_us"] > 0 and row["p99_us"] >= row["median_us"]
    assert "onnxruntime run" in r.stdout  # the rich table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "/no/such/model.onnx"), "model file not found: /no/such/model.onnx"),
        (("inspect", __file__), "is not a valid ONNX model"),
        (("run", MLP, "--input", "x"), "--input takes name=file.npy"),
        (("run", MLP, "--input", "x=/no/such.npy"), "--input x: cannot read"),
    ],
)
def test_user_errors_are_one_line_and_nonzero(args: tuple[str, ...], message: str) -> None:
    r = cli(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bad_input_shape_is_reported(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 63), np.float32))
    r = cli("run", MLP, "--input", f"x={tmp_path / 'x.npy'}")
    assert r.returncode == 2
    assert "input 'x': dim 1 is 63, expected 64" in r.stderr


def test_measure_pairs_every_burst_with_the_baseline() -> None:
    a = np.ones(1000)
    results = measure({"base": lambda: a.sum(), "other": lambda: a.cumsum()}, "base", 0.2)
    base, other = results["base"], results["other"]
    assert len(base.burst_us) == len(other.burst_us) >= 5
    assert all(r == 1.0 for r in base.ratios)
    assert other.ratio > 0 and other.median_us > 0
    table = markdown_table(results, "base")
    assert all(col in table for col in COLUMNS)
    assert "base (baseline)" in table


def test_check_agreement_names_the_disagreeing_runner() -> None:
    good = lambda: [np.array([1.0, 2.0])]  # noqa: E731 - a tiny stand-in runtime
    bad = lambda: [np.array([1.0, 2.5])]  # noqa: E731
    check_agreement({"a": good, "b": good})
    with pytest.raises(AssertionError, match="b output 0 vs a"):
        check_agreement({"a": good, "b": bad})
