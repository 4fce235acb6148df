"""``model.profile`` and ``tfrt-py profile``: per-node figures from the model's own executor
kind, a Chrome trace covering the async executor's threads, the model left unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import tfrt_py
from tfrt_py.cli import main
from tfrt_py.ir import GraphBuilder

F32 = np.float32


def _mlp() -> tfrt_py.ir.Graph:
    b = GraphBuilder("mlp")
    x = b.input("x", F32, (4, 64))
    h = b.op("Relu", b.op("MatMul", x, b.const(np.ones((64, 128), F32) / 64)))
    b.output(b.op("Softmax", b.op("MatMul", h, b.const(np.ones((128, 10), F32)))), "y")
    return b.build()


def _two_branches() -> tfrt_py.ir.Graph:
    """Two big MatMuls with no path between them: auto picks the async executor."""
    b = GraphBuilder("branches")
    x = b.input("x", F32, (256, 512))
    w = np.random.default_rng(0).standard_normal((512, 512)).astype(F32)
    a = b.op("MatMul", x, b.const(w))
    c = b.op("MatMul", x, b.const(w.T.copy()))
    b.output(b.op("Add", a, c), "y")
    return b.build()


def test_sync_profile_has_every_node_and_sums_to_the_call() -> None:
    model = tfrt_py.load(_mlp(), executor="sync", optimize=False)
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(F32)
    report = model.profile({"x": x}, repeat=5)
    assert report.executor == "sync" and report.repeat == 5
    assert sorted(n.name for n in report.nodes) == sorted(n.name for n in model.graph.nodes)
    assert [n.us for n in report.nodes] == sorted((n.us for n in report.nodes), reverse=True)
    assert sum(n.share for n in report.nodes) == pytest.approx(1.0)
    matmuls = [n for n in report.nodes if n.op == "MatMul"]
    assert all(n.gflops is not None and n.gflops > 0 for n in matmuls)
    assert {n.shapes for n in matmuls} == {"4x64, 64x128", "4x128, 128x10"}
    assert sum(n.us for n in report.nodes) <= report.call_us * 1.5
    text = str(report)
    assert "MatMul" in text and "by op:" in text and "µs per call" in text
    # the model itself still runs its own, untimed kernels
    np.testing.assert_allclose(model.run({"x": x})["y"], tfrt_py.load(_mlp()).run({"x": x})["y"])


def test_async_trace_covers_the_pool_threads(tmp_path: Path) -> None:
    model = tfrt_py.load(_two_branches())
    assert model.executor == "async"
    x = np.ones((256, 512), F32)
    report = model.profile({"x": x}, repeat=3)
    path = tmp_path / "trace.json"
    report.save_trace(str(path))
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in spans) == sorted(n.name for n in model.graph.nodes)
    assert len({e["tid"] for e in spans if "MatMul" in e["name"]}) == 2  # caller + a worker
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"]
    assert any("worker" in n for n in names)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)


def test_native_profile_reports_the_native_call() -> None:
    b = GraphBuilder("tiny")
    x = b.input("x", F32, (1, 16))
    b.output(b.op("Relu", b.op("MatMul", x, b.const(np.eye(16, dtype=F32)))), "y")
    model = tfrt_py.load(b.build(), executor="native", native="eager")
    report = model.profile({"x": np.ones((1, 16), F32)}, repeat=3)
    assert report.executor == "native"
    assert "one numba function" in report.note and "µs per call" in report.note


def test_bad_repeat_is_a_value_error() -> None:
    model = tfrt_py.load(_mlp(), executor="sync")
    with pytest.raises(ValueError, match="repeat"):
        model.profile({"x": np.ones((4, 64), F32)}, repeat=0)


def test_cli_profile_prints_the_table_and_writes_a_trace(tmp_path: Path) -> None:
    path = Path(tfrt_py.__file__).parent / "examples" / "mlp_small.onnx"
    trace = tmp_path / "t.json"
    result = CliRunner().invoke(
        main, ["profile", str(path), "--executor", "sync", "--repeat", "3", "--trace", str(trace)]
    )
    assert result.exit_code == 0, result.output
    assert "Linear" in result.output and "by op:" in result.output
    assert json.loads(trace.read_text())["traceEvents"]
