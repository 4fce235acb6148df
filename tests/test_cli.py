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


def test_check_agreement_allows_a_rounding_step_where_asked() -> None:
    """A model that rounds activations at run time (``bench`` passes its
    ``rounding_tolerance``): a step of 1e-3 of the output's scale agrees, 0.1 does not,
    and without ``scale_tol`` neither does."""
    ref = np.linspace(-1.0, 1.0, 64).astype(np.float32)
    step, wrong = ref.copy(), ref.copy()
    step[5] += 1e-3
    wrong[5] += 0.1
    check_agreement({"a": lambda: [ref], "b": lambda: [step]}, scale_tol=2e-2)
    with pytest.raises(AssertionError, match="b output 0 vs a"):
        check_agreement({"a": lambda: [ref], "b": lambda: [step]})
    with pytest.raises(AssertionError, match="b output 0 vs a"):
        check_agreement({"a": lambda: [ref], "b": lambda: [wrong]}, scale_tol=2e-2)


def _cli_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a process where ``module`` cannot be imported (as if not installed)."""
    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv = ['tfrt-py', *{args!r}]; "
            "from tfrt_py.cli import main; main()")  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_bench_without_onnxruntime_says_what_to_install_before_any_work() -> None:
    """Issue 33: no user extra installs onnxruntime, and bench's default --vs ended in a
    30-line traceback."""
    r = _cli_without("onnxruntime", "bench", MLP, "--seconds", "0.1")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "--vs onnxruntime needs onnxruntime, which is not installed" in r.stderr
    assert "--vs none" in r.stderr
    r = _cli_without("onnxruntime", "bench", MLP, "--seconds", "0.1", "--vs", "none")
    assert r.returncode == 0, r.stderr
    assert "tfrt_py[" in r.stdout and "onnxruntime" not in r.stdout
    r = cli("bench", MLP, "--vs", "tensorflow")
    assert r.returncode == 2 and "Invalid value for '--vs'" in r.stderr


def test_plot_without_matplotlib_fails_before_the_run(tmp_path: Path) -> None:
    r = _cli_without("matplotlib", "profile", MLP, "--plot", str(tmp_path / "p.png"))
    assert r.returncode == 2, r.stderr
    assert "--plot needs matplotlib" in r.stderr
    assert "µs" not in r.stdout  # nothing was profiled first


def test_run_summarizes_and_writes_outputs(tmp_path: Path) -> None:
    r = cli("run", MLP, "--output", str(tmp_path / "o.npz"))
    assert r.returncode == 0, r.stderr
    assert "probs float32[1, 10] min" in r.stdout and "[[" not in r.stdout
    saved = np.load(tmp_path / "o.npz", allow_pickle=False)
    assert saved["probs"].shape == (1, 10)
    r = cli("run", MLP, "-o", str(tmp_path / "o.json"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "o.json").read_text())
    np.testing.assert_allclose(doc["probs"], saved["probs"], rtol=1e-6)
    r = cli("run", MLP, "-o", str(tmp_path / "o.txt"))
    assert r.returncode == 2 and "must end in .npz or .json" in r.stderr


def test_random_ids_stay_inside_the_tables_they_index(tmp_path: Path) -> None:
    """Issue 33: random ints in [0, 4) for a BERT's token_type_ids (a 2-row table) failed
    with "index 2 is out of bounds"."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    words = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "words")
    types = numpy_helper.from_array(rng.standard_normal((2, 8)).astype(np.float32), "types")
    nodes = [
        helper.make_node("Gather", ["words", "input_ids"], ["w"]),
        helper.make_node("Cast", ["token_type_ids"], ["tt"], to=TensorProto.INT64),
        helper.make_node("Gather", ["types", "tt"], ["t"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axis"], ["m3"]),
        helper.make_node("Add", ["w", "t"], ["s"]),
        helper.make_node("Mul", ["s", "m3"], ["y"]),
    ]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", 64])
           for n in ("input_ids", "token_type_ids", "attention_mask")]  # fmt: skip
    axis = numpy_helper.from_array(np.array([2], np.int64), "axis")
    graph = helper.make_graph(nodes, "embed", ids,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[words, types, axis])  # fmt: skip
    path = tmp_path / "embed.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())  # fmt: skip
    r = cli("run", str(path))
    assert r.returncode == 0, r.stderr
    assert "y float32[1, 64, 8]" in r.stdout


def test_inspect_json() -> None:
    r = cli("inspect", ADS, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["inputs"][0] == {"name": "f0", "type": "tensor", "dtype": "float32",
                                "shape": [1, 1]}  # fmt: skip
    assert doc["ops_as_loaded"]["Div"] == 18 and sum(doc["ops"].values()) == doc["nodes"]
    assert doc["executor"] in ("sync", "async", "native")
    assert doc["metadata"]["opset_imports"] and isinstance(doc["describe"], list)
